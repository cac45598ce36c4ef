"""Peak host memory of ``load_checkpoint`` on a random ~100M-parameter Llama, in a fresh process.

    python scripts/loader_memory.py [--dtype bfloat16] [--params-m 100]

Writes the checkpoint once (in --dtype, default bf16 as most hub checkpoints are), then loads it in
a child process computing in fp32 and prints the peak memory the load added, as a multiple of the
loaded model's size: resident (RSS, which includes the memory-mapped safetensors file's pages while
it is open: page cache the kernel can drop) and anonymous (the process's own allocations: what
cannot be dropped, and what runs a machine out of memory).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, threading, time, torch
from inferlab.model.loader import load_checkpoint, load_config
from inferlab.model import CausalLM
from pathlib import Path

def kb(field):  # from /proc/self/status: VmRSS (resident), VmHWM (its peak), RssAnon (anonymous part)
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1])

with torch.device("meta"):  # warm up: torch maps in code pages the first time it builds a model
    CausalLM(load_config(Path(sys.argv[1])))
torch.ones(1)
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM (Linux)
base_rss, base_anon, peak_anon, done = kb("VmRSS"), kb("RssAnon"), [0], []

def sample():  # anonymous memory has no kernel high-water mark: sample it
    while not done:
        peak_anon[0] = max(peak_anon[0], kb("RssAnon"))
        time.sleep(0.001)

t = threading.Thread(target=sample); t.start()
model, _ = load_checkpoint(sys.argv[1], device="cpu", dtype=torch.float32)
done.append(1); t.join()
size = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"model_mb": size / 2**20,
                  "peak_rss_over_model": (kb("VmHWM") - base_rss) * 1024 / size,
                  "peak_anon_over_model": (peak_anon[0] - base_anon) * 1024 / size}))
"""


def write_model(folder: Path, params_m: int, dtype: str) -> None:
    import torch

    from inferlab.model.config import ModelConfig
    from inferlab.model.loader import save_checkpoint
    from inferlab.model import CausalLM

    layers = max(1, round((params_m * 1e6 - 32000 * 768) / 7.08e6))
    cfg = ModelConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                      num_attention_heads=12, num_key_value_heads=12, head_dim=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = CausalLM(cfg)
    save_checkpoint(model, None, folder, dtype=getattr(torch, dtype))
    print(f"wrote {model.num_parameters() / 1e6:.1f}M parameters in {dtype} to {folder}", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--params-m", type=int, default=100)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        write_model(folder, args.params_m, args.dtype)
        out = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, check=True)
        res = json.loads(out.stdout)
    print(json.dumps({k: round(v, 2) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
