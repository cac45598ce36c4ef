"""Every quantization method side by side on one model: bytes, perplexity, decode speed.

Rows: the unquantized "fp32" and "fp16", then int8, int4 (round-to-nearest, g128), gptq and awq
(4-bit g128), nf4, q8_0, q4_0, q4_k, and 3-bit int4/gptq/awq rows, where the methods differ most
(as the GPTQ paper reports). ``weight_bytes`` counts the quantized projections (q/k/v/o,
gate/up/down) as stored, codes plus scales; the embeddings and the (tied) lm_head stay in fp16 in
every row and are reported apart as ``other_bytes``. Perplexity is measured on the test split,
calibration uses the train split. With llama-cpp-python installed, the GGUF rows also get
llama.cpp's decode tokens/s on the same .gguf file (the CPU engine to compare against).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch

from inferlab.errors import InferlabError

ROWS = [("int8", 8, None), ("int4", 4, 128), ("gptq", 4, 128), ("awq", 4, 128), ("nf4", 4, None),
        ("q8_0", 8, None), ("q4_0", 4, None), ("q4_k", 4, None), ("int4", 3, 128), ("gptq", 3, 128),
        ("awq", 3, 128)]
PROMPT = "def fibonacci(n):\n    "


def _decode_tokens_per_s(model, ids, new_tokens: int, repeats: int) -> float:
    from inferlab.bench.decode import decode_tokens_per_s  # the one timing code, shared with bench decode
    from inferlab.llm import LLM
    return decode_tokens_per_s(LLM.from_model(model, max_num_seqs=1), ids, new_tokens, repeats)


def _llama_cpp_tokens_per_s(model, tok, method: str, ids, new_tokens: int) -> float | None:
    """llama.cpp's greedy decode speed on the same blocks (None without llama-cpp-python, or if it fails)."""
    import importlib.util
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from inferlab.quant import llama_cpp_runner
    from inferlab.quant.gguf_export import write_gguf
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gguf(model, tok, f"{tmp}/m", method)
        try:
            return round(llama_cpp_runner.run(path, ids, new_tokens)["tokens_per_s"], 1)
        except llama_cpp_runner.LlamaCppError as exc:
            print(f"inferlab bench quant: {exc}", file=sys.stderr)
            return None


def _row(model_name: str, name: str, bits: int, group, max_tokens: int, calib_samples: int, new_tokens: int,
         repeats: int, progress: bool = False) -> dict:
    """Quantize one copy of the model with one method (or none, for fp32/fp16) and measure it."""
    from inferlab.eval.ppl import evaluate, test_stream
    from inferlab.loader import load_checkpoint
    from inferlab.quant.calibration import calibration_tokens
    from inferlab.quant.quantize import linear_weight_bytes, quantize_model

    torch.manual_seed(0)
    model, tok = load_checkpoint(model_name, device="cpu", dtype=torch.float32)
    if tok is None:
        raise InferlabError(f"{model_name} has no tokenizer.json: the benchmark needs its tokenizer")
    n_weights = linear_weight_bytes(model)[1]
    fp16_linear = 2 * n_weights
    seconds = 0.0
    if name == "fp16":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.half().float())  # fp16 storage, computed in fp32 on CPU
    if name in ("fp32", "fp16"):
        nbytes, group = {"fp32": 2, "fp16": 1}[name] * fp16_linear, None
    else:
        calib = None
        if name in ("gptq", "awq"):
            calib = calibration_tokens(tok, calib_samples, min(512, model.config.max_position_embeddings))
        t = time.perf_counter()
        qcfg = quantize_model(model, name, bits, group, calibration_tokens=calib, progress=progress)
        seconds = time.perf_counter() - t
        nbytes, group = linear_weight_bytes(model)[0], qcfg.get("group_size", qcfg.get("block_size"))
    ids = test_stream(tok)
    prompt = tok.encode(PROMPT)
    ppl = evaluate(model, ids, max_tokens=max_tokens)["ppl"]
    row = {"method": name, "bits": bits, "group_size": group, "bits_per_weight": round(8 * nbytes / n_weights, 3),
           "weight_bytes": nbytes, "other_bytes": 2 * (model.num_parameters() - n_weights),
           "bytes_ratio_vs_fp16": round(nbytes / fp16_linear, 4), "ppl": round(ppl, 4),
           "decode_tokens_per_s": round(_decode_tokens_per_s(model, prompt, new_tokens, repeats), 1),
           "quantize_s": round(seconds, 1), "ppl_tokens": min(max_tokens, len(ids) - 1)}
    if name in ("q8_0", "q4_0", "q4_k"):
        row["llama_cpp_decode_tokens_per_s"] = _llama_cpp_tokens_per_s(model, tok, name, prompt, new_tokens)
    return row


def run(model_name: str = "target", max_tokens: int = 16384, calib_samples: int = 32, new_tokens: int = 64,
        repeats: int = 2, only: list[str] | None = None, progress: bool = True, jobs: int = 1) -> dict:
    """All rows; ``jobs`` > 1 measures rows in that many worker processes (perplexity is unchanged,
    decode tokens/s then shares the CPU and is only indicative)."""
    specs = [("fp32", 32, None), ("fp16", 16, None)] + [r for r in ROWS if not only or r[0] in only]
    args = [(model_name, m, b, g, max_tokens, calib_samples, new_tokens, repeats) for m, b, g in specs]
    if jobs > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            rows = list(pool.map(_row, *zip(*args)))
    else:
        rows = []
        for a in args:
            rows.append(_row(*a, progress=progress))
            if progress:
                print(f"  {a[1]} w{a[2]}: ppl {rows[-1]['ppl']:.3f}", flush=True)
    ref = rows[1]["ppl"]
    for r in rows:
        r["ppl_delta_pct"] = round(100 * (r["ppl"] / ref - 1), 3)
    return {"model": model_name, "ppl_tokens": rows[0]["ppl_tokens"], "calibration_samples": calib_samples,
            "rows": rows, "goals": goals(rows)}


def goals(rows: list[dict]) -> dict:
    """The targets: INT8 within 0.5% of fp16; GPTQ and AWQ close >= 40% of RTN's 4-bit gap; INT4 <= 0.3x bytes."""
    by = {(r["method"], r["bits"]): r for r in rows}
    out = {}
    base = by.get(("fp16", 16))
    if base and ("int8", 8) in by:
        out["int8_ppl_delta_pct"] = {"value": by[("int8", 8)]["ppl_delta_pct"], "target": "<= 0.5",
                                     "met": abs(by[("int8", 8)]["ppl_delta_pct"]) <= 0.5}
    for bits in (4, 3):
        rtn = by.get(("int4", bits))
        for m in ("gptq", "awq"):
            if base and rtn and (m, bits) in by and rtn["ppl"] > base["ppl"]:
                closed = (rtn["ppl"] - by[(m, bits)]["ppl"]) / (rtn["ppl"] - base["ppl"])
                out[f"{m}_w{bits}_gap_closed"] = {"value": round(closed, 3), "target": ">= 0.4" if bits == 4 else "-",
                                                  "met": closed >= 0.4 if bits == 4 else None}
    if ("int4", 4) in by:
        out["int4_bytes_ratio_vs_fp16"] = {"value": by[("int4", 4)]["bytes_ratio_vs_fp16"], "target": "<= 0.3",
                                           "met": by[("int4", 4)]["bytes_ratio_vs_fp16"] <= 0.3}
    return out


def table(res: dict) -> str:
    has_cpp = any(r.get("llama_cpp_decode_tokens_per_s") for r in res["rows"])
    head = f"{'method':<14}{'bits/w':>8}{'MiB':>8}{'x fp16':>8}{'ppl':>9}{'delta':>9}{'tok/s':>8}"
    lines = [f"{res['model']}: perplexity on {res['ppl_tokens']:,} test tokens; linear weights only in MiB",
             head + ("  llama.cpp tok/s" if has_cpp else "")]
    for r in res["rows"]:
        name = r["method"] + (f" w{r['bits']}" if r["method"] in ("int4", "gptq", "awq") else "")
        line = (f"{name:<14}{r['bits_per_weight']:>8.2f}{r['weight_bytes'] / 2**20:>8.2f}"
                f"{r['bytes_ratio_vs_fp16']:>8.3f}{r['ppl']:>9.3f}{r['ppl_delta_pct']:>8.2f}%{r['decode_tokens_per_s']:>8.1f}")
        if r.get("llama_cpp_decode_tokens_per_s"):
            line += f"  {r['llama_cpp_decode_tokens_per_s']:>8.1f}"
        lines.append(line)
    verdict = {True: ", met", False: ", missed", None: ""}
    lines.append("goals: " + "; ".join(f"{k} {v['value']} ({v['target']}{verdict[v['met']]})"
                                       for k, v in res["goals"].items()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench quant", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target")
    p.add_argument("--max-tokens", type=int, default=16384, help="test tokens scored per row")
    p.add_argument("--calib-samples", type=int, default=32, help="512-token train windows for gptq/awq")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per speed run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--methods", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="measure rows in N processes (decode speed then shares the CPU)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if min(args.max_tokens, args.calib_samples, args.new_tokens, args.repeats, args.jobs) < 1:
        p.error("--max-tokens, --calib-samples, --new-tokens, --repeats and --jobs must be >= 1")
    only = args.methods.split(",") if args.methods else None
    if only:
        from inferlab.quant.methods import resolve
        for m in only:
            resolve(m)
    res = run(args.model, args.max_tokens, args.calib_samples, args.new_tokens, args.repeats, only,
              progress=not args.json, jobs=args.jobs)
    print(json.dumps(res) if args.json else table(res))
    return 0
