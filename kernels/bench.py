"""Benchmark every kernel against its torch baseline on a GPU: ``python -m inferlab.kernels.bench``.

Prints, per kernel and shape, TFLOP/s (attention prefill) or GB/s (decode, W4A16 matrix-vector)
and the speed ratio to the baseline measured in the same process: SDPA's FlashAttention backend
for attention, dequantize-then-matmul for W4A16. Shapes are an LLM's (8B-class: 32 query heads,
8 K/V heads, head dim 128, bf16; sequences 1k-8k). The goals checked at the end are an H200's.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def hbm_bandwidth() -> tuple[str, float | None]:
    name = torch.cuda.get_device_name()
    for key, bw in HBM_BYTES_PER_S.items():
        if key in name:
            return name, bw
    return name, None


def run(quick: bool = False) -> list[dict]:
    from inferlab.kernels import flash_attention, flash_decoding, paged_attention, w4a16_matmul

    lens = (1024, 8192) if quick else (1024, 2048, 4096, 8192)
    rows = flash_attention.bench(seq_lens=lens)
    rows += flash_decoding.bench(seq_lens=lens)
    rows += paged_attention.bench(seq_lens=lens)
    rows += w4a16_matmul.bench()
    return rows


def goals(rows: list[dict], bandwidth: float | None) -> list[tuple[str, bool, str]]:
    """The targets: flash attention >= 0.9x SDPA flash (every length); W4A16 matrix-vector at
    >= 75% of HBM bandwidth (the best M=1 shape)."""
    fa = [r["ratio"] for r in rows if r["kernel"] == "flash_attention"]
    out = [("flash_attention >= 0.9x SDPA flash", min(fa) >= 0.9, f"worst {min(fa):.2f}x")]
    errs = {r["kernel"]: max(e["max_err"] for e in rows if e["kernel"] == r["kernel"]) for r in rows}
    out.append(("every kernel agrees with its baseline (bf16)", max(errs.values()) < 0.05,
                ", ".join(f"{k} {v:.2g}" for k, v in errs.items())))
    gemv = [r["gbps"] for r in rows if r["kernel"] == "w4a16_matmul" and r["shape"].startswith("M1 ")]
    if bandwidth:
        frac = max(gemv) * 1e9 / bandwidth
        out.append(("w4a16 matrix-vector >= 75% of HBM", frac >= 0.75, f"best {frac:.0%} of {bandwidth / 1e12:.2f} TB/s"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferlab.kernels.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--quick", action="store_true", help="two sequence lengths instead of four")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m inferlab.kernels.bench: error: no CUDA device; these benchmarks need a GPU "
              "(on a CPU, check correctness with pytest tests/kernels)", file=sys.stderr)
        return 2
    name, bandwidth = hbm_bandwidth()
    print(f"device: {name}, torch {torch.__version__}")
    rows = run(args.quick)
    print(f"{'kernel':<16} {'shape':<34} {'ours':>14} {'baseline':>14} {'ratio':>7} {'max err':>9}")
    for r in rows:
        unit = "gbps" if "gbps" in r and r["kernel"] != "flash_attention" else "tflops"
        label = "GB/s" if unit == "gbps" else "TFLOP/s"
        print(f"{r['kernel']:<16} {r['shape']:<34} {r[unit]:>8.1f} {label:<5} "
              f"{r['baseline_' + unit]:>8.1f} {label:<5} {r['ratio']:>6.2f}x {r['max_err']:>9.2g}")
    print("goals:")
    met = goals(rows, bandwidth)
    for text, ok, detail in met:
        print(f"  {'MET ' if ok else 'MISS'} {text}: {detail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows, "goals": met}, f, indent=1)
    agree = next(ok for text, ok, _ in met if text.startswith("every kernel agrees"))
    return 0 if agree else 1  # a speed goal missed is a finding; a wrong answer is a failure


if __name__ == "__main__":
    sys.exit(main())
