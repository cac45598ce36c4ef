"""Every quantization method side by side on one model: bytes, perplexity, decode speed.

Rows: the unquantized "fp32" and "fp16", then int8, int4 (round-to-nearest, g128), gptq and awq
(4-bit g128), nf4, q8_0, q4_0, q4_k, and 3-bit int4/gptq/awq rows, where the methods differ most
(as the GPTQ paper reports). ``weight_bytes`` counts the quantized projections (q/k/v/o,
gate/up/down) as stored, codes plus scales; the embeddings and the (tied) lm_head stay in fp16 in
every row and are reported apart as ``other_bytes``. Perplexity follows the one protocol of
:mod:`inferlab.eval.ppl` (the whole test split unless ``--max-tokens``), so the fp32 row equals
``inferlab eval ppl`` and ``inferlab models``; calibration uses the train split. Rows are named
with their bits (``int4-w3``); every ratio is named for what over what (see ``FIELDS``). With llama-cpp-python installed, the GGUF rows also get
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
FIELDS = {  # printed with the JSON, so each number says what it is
    "weight_bytes": "bytes of the quantized projections as stored (codes + scales + zeros)",
    "other_bytes": "bytes of everything else (embeddings, norms, lm_head) in fp16, the same in every row",
    "bits_per_weight": "8 x weight_bytes / number of projection weights",
    "bytes_ratio_vs_fp16": "weight_bytes / the fp16 row's weight_bytes",
    "ppl_delta_pct": "100 x (ppl / the fp16 row's ppl - 1)",
    "gap_closed": "(ppl of int4 round-to-nearest - ppl of the method) / (ppl of int4 round-to-nearest - ppl of fp16)",
}
# Why a goal can be missed, said next to the miss (what the method does and where it gains most).
WHY_MISSED = {
    "awq": "AWQ only rescales input channels by their mean activation before round-to-nearest; it gains most "
           "where a few channels carry much larger activations than the rest (the 7B+ models of its paper)",
    "gptq": "GPTQ's error feedback needs calibration data like the test text; try more --calib-samples",
    "int8": "per-channel INT8 loses accuracy when a row holds a few very large weights",
    "int4": "group-wise INT4 needs groups of 128 or fewer columns to stay near 0.25x the fp16 bytes",
}


def row_name(method: str, bits: int) -> str:
    """``int4-w3``, ``gptq-w4``: the integer-grid methods come in several widths; the others have one."""
    return f"{method}-w{bits}" if method in ("int4", "gptq", "awq") else method


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


def _row(model_name: str, name: str, bits: int, group, max_tokens: int | None, calib_samples: int, new_tokens: int,
         repeats: int, progress: bool = False) -> dict:
    """Quantize one copy of the model with one method (or none, for fp32/fp16) and measure it."""
    from inferlab.eval.ppl import evaluate, protocol, test_stream
    from inferlab.loader import load_checkpoint
    from inferlab.quant.calibration import calibration_tokens
    from inferlab.quant.quantize import linear_weight_bytes, quantize_model

    torch.manual_seed(0)
    model, tok = load_checkpoint(model_name, device="cpu", dtype=torch.float32)
    if tok is None:
        raise InferlabError(f"{model_name} has no tokenizer.json: the benchmark needs its tokenizer")
    n_weights = linear_weight_bytes(model)[1]
    fp16_linear = 2 * n_weights
    other_bytes = 2 * (model.num_parameters() - n_weights)  # before quantizing: codes are buffers, not parameters
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
    res = evaluate(model, ids, max_tokens=max_tokens, progress=progress, desc=f"perplexity {row_name(name, bits)}")
    row = {"name": row_name(name, bits), "method": name, "bits": bits, "group_size": group,
           "bits_per_weight": round(8 * nbytes / n_weights, 3), "weight_bytes": nbytes, "other_bytes": other_bytes,
           "bytes_ratio_vs_fp16": round(nbytes / fp16_linear, 4), "ppl": round(res["ppl"], 4),
           "decode_tokens_per_s": round(_decode_tokens_per_s(model, prompt, new_tokens, repeats), 1),
           "quantize_s": round(seconds, 1), "ppl_tokens": res["tokens"],
           "ppl_protocol": protocol(res, total=len(ids) - 1)}
    if name in ("fp32", "q8_0", "q4_0", "q4_k"):
        row["llama_cpp_decode_tokens_per_s"] = _llama_cpp_tokens_per_s(model, tok, "f32" if name == "fp32" else name,
                                                                        prompt, new_tokens)
    return row


def run(model_name: str = "target", max_tokens: int | None = None, calib_samples: int = 32, new_tokens: int = 64,
        repeats: int = 2, only: list[str] | None = None, progress: bool = True, jobs: int = 1) -> dict:
    """All rows; ``jobs`` > 1 measures rows in that many worker processes (perplexity is unchanged,
    decode tokens/s then shares the CPU and is only indicative). ``progress``: bars on stderr."""
    specs = [("fp32", 32, None), ("fp16", 16, None)] + [r for r in ROWS if not only or r[0] in only]
    args = [(model_name, m, b, g, max_tokens, calib_samples, new_tokens, repeats) for m, b, g in specs]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(args), desc="bench quant", unit="row")
    rows = []
    if jobs > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            for row in pool.map(_row, *zip(*args)):
                rows.append(row)
                if bar is not None:
                    bar.set_postfix_str(f"{row['name']} ppl {row['ppl']:.3f}")
                    bar.update()
    else:
        for a in args:
            if bar is not None:
                bar.set_postfix_str(row_name(a[1], a[2]))
            rows.append(_row(*a, progress=progress))
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    ref = rows[1]["ppl"]
    for r in rows:
        r["ppl_delta_pct"] = round(100 * (r["ppl"] / ref - 1), 3)
    return {"model": model_name, "ppl_tokens": rows[0]["ppl_tokens"], "ppl_protocol": rows[0]["ppl_protocol"],
            "calibration_samples": calib_samples, "fields": FIELDS, "rows": rows, "goals": goals(rows)}


def goals(rows: list[dict]) -> dict:
    """The targets: INT8 within 0.5% of fp16; GPTQ and AWQ close >= 40% of RTN's 4-bit gap; INT4 <= 0.3x bytes.
    Each goal reads {"value", "target", "met"}; a missed one adds "why" (measured vs target, and what
    limits the method); a 3-bit gap has no target ("met": None) and is reported only."""
    by = {(r["method"], r["bits"]): r for r in rows}
    out = {}
    base = by.get(("fp16", 16))
    if base and ("int8", 8) in by:
        out["int8_ppl_delta_pct"] = {"value": by[("int8", 8)]["ppl_delta_pct"], "target": "<= 0.5",
                                     "met": abs(by[("int8", 8)]["ppl_delta_pct"]) <= 0.5, "method": "int8"}
    for bits in (4, 3):
        rtn = by.get(("int4", bits))
        for m in ("gptq", "awq"):
            if base and rtn and (m, bits) in by and rtn["ppl"] > base["ppl"]:
                closed = (rtn["ppl"] - by[(m, bits)]["ppl"]) / (rtn["ppl"] - base["ppl"])
                out[f"{m}_w{bits}_gap_closed"] = {"value": round(closed, 3), "target": ">= 0.4" if bits == 4 else "none",
                                                  "met": closed >= 0.4 if bits == 4 else None, "method": m}
    if ("int4", 4) in by:
        out["int4_bytes_ratio_vs_fp16"] = {"value": by[("int4", 4)]["bytes_ratio_vs_fp16"], "target": "<= 0.3",
                                           "met": by[("int4", 4)]["bytes_ratio_vs_fp16"] <= 0.3, "method": "int4"}
    for name, g in out.items():
        method = g.pop("method")
        if g["met"] is False:
            g["why"] = f"{name} is {g['value']}, the target {g['target']}: {WHY_MISSED[method]}"
    return out


def table(res: dict) -> str:
    has_cpp = any(r.get("llama_cpp_decode_tokens_per_s") for r in res["rows"])
    head = f"{'method':<14}{'bits/w':>8}{'MiB':>8}{'x fp16':>8}{'ppl':>9}{'delta':>9}{'tok/s':>8}"
    from inferlab.eval.ppl import describe
    lines = [f"{res['model']}: perplexity on the {describe(res['ppl_protocol'])}; MiB of projection weights "
             f"(other weights: {res['rows'][0]['other_bytes'] / 2**20:.2f} MiB in fp16 in every row)",
             head + ("  llama.cpp tok/s" if has_cpp else "")]
    for r in res["rows"]:
        name = r["name"]
        line = (f"{name:<14}{r['bits_per_weight']:>8.2f}{r['weight_bytes'] / 2**20:>8.2f}"
                f"{r['bytes_ratio_vs_fp16']:>8.3f}{r['ppl']:>9.3f}{r['ppl_delta_pct']:>8.2f}%{r['decode_tokens_per_s']:>8.1f}")
        if r.get("llama_cpp_decode_tokens_per_s"):
            line += f"  {r['llama_cpp_decode_tokens_per_s']:>8.1f}"
        lines.append(line)
    verdict = {True: ", met", False: ", missed", None: ""}
    lines.append("goals: " + "; ".join(f"{k} {v['value']} (target {v['target']}{verdict[v['met']]})"
                                       for k, v in res["goals"].items()))
    lines += [f"missed: {v['why']}" for v in res["goals"].values() if v.get("why")]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from inferlab.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab bench quant", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target", help="embedded name or HF folder (default: target)")
    p.add_argument("--max-tokens", type=int, default=None, help="score only the first N test tokens per row, "
                   "faster but not comparable with `inferlab models` (default: the whole test split)")
    p.add_argument("--calib-samples", type=int, default=32, help="512-token train windows for gptq/awq (default: 32)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per speed run (default: 64)")
    p.add_argument("--repeats", type=int, default=2, help="speed runs per row, best kept (default: 2)")
    p.add_argument("--methods", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="measure rows in N processes; decode speed then shares "
                   "the CPU (default: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    args = p.parse_args(argv)
    if min(args.max_tokens or 1, args.calib_samples, args.new_tokens, args.repeats, args.jobs) < 1:
        p.error("--max-tokens, --calib-samples, --new-tokens, --repeats and --jobs must be >= 1")
    only = args.methods.split(",") if args.methods else None
    if only:
        from inferlab.quant.methods import resolve
        for m in only:
            resolve(m)
    res = run(args.model, args.max_tokens, args.calib_samples, args.new_tokens, args.repeats, only,
              progress=True, jobs=args.jobs)
    print(json.dumps(res) if args.json else table(res))
    return 0
