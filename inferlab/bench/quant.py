"""Every quantization method side by side: bytes and perplexity on one model, decode speed per format.

Rows: the unquantized "fp32" and "fp16", then int8, int4 (round-to-nearest, g128), gptq and awq
(4-bit g128), nf4, q8_0, q4_0, q4_k, and 3-bit int4/gptq/awq rows, where the methods differ most
(as the GPTQ paper reports). ``weight_bytes`` counts the quantized projections (q/k/v/o,
gate/up/down) as stored, codes plus scales; the embeddings and the (tied) lm_head stay in fp16 in
every row and are reported apart as ``other_bytes``. Perplexity follows the one protocol of
:mod:`inferlab.eval.ppl` (the whole test split unless ``--max-tokens``), so the fp32 row equals
``inferlab eval ppl`` and ``inferlab models``; calibration uses the train split. Rows are named
with their bits (``int4-w3``); every ratio is named for what over what (see ``FIELDS``).

Decode speed is per weight *format*, since the format decides the kernel (GPTQ, AWQ and 3-bit
INT4 load as INT4 codes and run int4's kernel): every format is timed at the end in ONE interleaved
pass (:mod:`inferlab.bench.quant_speed`, with ``bench decode``'s timing code), as tok/s and as a
ratio to fp32 from that same pass. It is timed on ``random-80m`` (``--speed-model``: random weights,
78.7M params, 315 MB in fp32, too big for the caches, so decode is memory-bound as in a real LLM;
timed only) and on the scored model (the target, 22 MB, fits in cache: there fewer bytes save no time
and the unpacking costs some).
With llama-cpp-python installed, the GGUF formats also get llama.cpp's decode tokens/s.
"""
from __future__ import annotations

import argparse
import os
import json
import time

import torch

from inferlab.bench.quant_speed import SPEED_MODEL, format_of, speed_goals, speed_pass
from inferlab.errors import InferlabError

ROWS = [("int8", 8, None), ("int4", 4, 128), ("gptq", 4, 128), ("awq", 4, 128), ("nf4", 4, None),
        ("q8_0", 8, None), ("q4_0", 4, None), ("q4_k", 4, None), ("int4", 3, 128), ("gptq", 3, 128),
        ("awq", 3, 128)]
FIELDS = {  # printed with the JSON, so each number says what it is
    "weight_bytes": "bytes of the quantized projections as stored (codes + scales + zeros)",
    "other_bytes": "bytes of everything else (embeddings, norms, lm_head) in fp16, the same in every row",
    "bits_per_weight": "8 x weight_bytes / number of projection weights",
    "bytes_ratio_vs_fp16": "weight_bytes / the fp16 row's weight_bytes",
    "ppl_delta_pct": "100 x (ppl / the fp16 row's ppl - 1)",
    "gap_closed": "(ppl of int4 round-to-nearest - ppl of the method) / (ppl of int4 round-to-nearest - ppl of fp16)",
    "format": "the weight format whose kernel decodes this row (gptq, awq and 3-bit int4 load as int4 codes)",
    "speed_tokens_per_s": "batch-1 greedy decode tokens/s of this row's format on the speed model (random weights)",
    "speed_vs_fp32": "speed_tokens_per_s / the fp32 format's, on the speed model, in the same interleaved pass",
    "decode_tokens_per_s": "the same for this row's format on the scored model (cache-resident if small)",
    "decode_vs_fp32": "decode_tokens_per_s / the fp32 format's, on the scored model, in the same pass",
    "llama_cpp_tokens_per_s": "llama.cpp's decode of a .gguf of the speed model in this format (as many threads as the speed pass)",
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


def _row(model_name: str, name: str, bits: int, group, max_tokens: int | None, calib_samples: int,
         progress: bool = False) -> dict:
    """Quantize one copy of the model with one method (or none, for fp32/fp16): bytes and perplexity."""
    from inferlab.eval.ppl import evaluate, protocol, test_stream
    from inferlab.model.loader import hf_model_folder, load_checkpoint
    from inferlab.quant.calibration import calibration_tokens
    from inferlab.quant.quantize import linear_weight_bytes, quantize_model

    torch.manual_seed(0)
    model, tok = load_checkpoint(hf_model_folder(model_name), device="cpu", dtype=torch.float32)  # a GGUF: its fp32 form
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
    res = evaluate(model, ids, max_tokens=max_tokens, progress=progress, desc=f"perplexity {row_name(name, bits)}")
    row = {"name": row_name(name, bits), "method": name, "bits": bits, "group_size": group,
           "bits_per_weight": round(8 * nbytes / n_weights, 3), "weight_bytes": nbytes, "other_bytes": other_bytes,
           "bytes_ratio_vs_fp16": round(nbytes / fp16_linear, 4), "ppl": round(res["ppl"], 4),
           "quantize_s": round(seconds, 1), "ppl_tokens": res["tokens"],
           "ppl_protocol": protocol(res, total=len(ids) - 1), "format": format_of(name)}
    return row


def run(model_name: str = "target", max_tokens: int | None = None, calib_samples: int = 32, new_tokens: int = 64,
        repeats: int = 2, only: list[str] | None = None, progress: bool = True, jobs: int = 1,
        speed_model: str = SPEED_MODEL, threads: int | None = None) -> dict:
    """All rows, then the one speed pass. ``jobs`` > 1 scores rows in that many worker processes
    (perplexity is unchanged; the speed pass runs alone afterwards, with ``threads`` torch threads).
    ``progress``: bars on stderr."""
    specs = [("fp32", 32, None), ("fp16", 16, None)] + [r for r in ROWS if not only or r[0] in only]
    args = [(model_name, m, b, g, max_tokens, calib_samples) for m, b, g in specs]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(args), desc="bench quant", unit="row")
    rows = []
    if jobs > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        from inferlab.quant.methods import METHODS
        slow_first = sorted(range(len(args)), key=lambda i: not METHODS.get(args[i][1], METHODS["int8"]).calibrated)
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(_row, *args[i]): i for i in slow_first}  # GPTQ/AWQ first: the longest
            done = {}
            for fut in cf.as_completed(futures):
                done[futures[fut]] = row = fut.result()
                if bar is not None:
                    bar.set_postfix_str(f"{row['name']} ppl {row['ppl']:.3f}")
                    bar.update()
        rows = [done[i] for i in range(len(args))]
    else:
        for a in args:
            if bar is not None:
                bar.set_postfix_str(row_name(a[1], a[2]))
            rows.append(_row(*a, progress=progress))
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.set_postfix_str("speed pass")
    ref = rows[1]["ppl"]
    for r in rows:
        r["ppl_delta_pct"] = round(100 * (r["ppl"] / ref - 1), 3)
    if threads:  # fixed, as llama.cpp's: the engine does not hand cores to other programs here
        torch.set_num_threads(threads)
        os.environ["INFERLAB_CPU_SHARE"] = "0"
    models = list(dict.fromkeys([speed_model, model_name]))
    speeds = speed_pass(models, list(dict.fromkeys(r["format"] for r in rows)), new_tokens, repeats)
    if bar is not None:
        bar.close()
    for r in rows:
        for key, model in (("speed", speed_model), ("decode", model_name)):
            s = speeds[model][r["format"]]
            r[f"{key}_tokens_per_s"], r[f"{key}_vs_fp32"] = s.get("tokens_per_s"), s.get("vs_fp32")
        if "llama_cpp_tokens_per_s" in speeds[speed_model][r["format"]]:
            r["llama_cpp_tokens_per_s"] = speeds[speed_model][r["format"]]["llama_cpp_tokens_per_s"]
    from inferlab.model import random_model
    speed = {"model": speed_model, "random_weights": random_model.is_random_model(speed_model),
             "threads": torch.get_num_threads(), "new_tokens": new_tokens, "repeats": repeats,
             "timing": "batch-1 greedy decode, every (model, format) held in memory and timed in one interleaved "
                       "pass, best of repeats (inferlab.bench.stats.best_rates)", "formats": speeds}
    return {"model": model_name, "ppl_tokens": rows[0]["ppl_tokens"], "ppl_protocol": rows[0]["ppl_protocol"],
            "calibration_samples": calib_samples, "speed": speed, "fields": FIELDS, "rows": rows,
            "goals": {**goals(rows), **speed_goals(speeds[speed_model], speed_model)}}


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
    from inferlab.eval.ppl import describe
    sp = res["speed"]
    models = list(dict.fromkeys([sp["model"], res["model"]]))
    has_cpp = any(r.get("llama_cpp_tokens_per_s") for r in res["rows"])
    lines = [f"{res['model']}: perplexity on the {describe(res['ppl_protocol'])}; MiB of projection weights "
             f"(other weights: {res['rows'][0]['other_bytes'] / 2**20:.2f} MiB in fp16 in every row)",
             f"decode speed per weight format (the format decides the kernel: gptq, awq and int4-w3 run int4's), "
             f"batch 1, greedy, {sp['new_tokens']} tokens, {sp['threads']} thread(s), best of {sp['repeats']}, all "
             f"formats in one interleaved pass; x fp32 = tok/s over fp32's in that pass (a shared machine: compare "
             f"ratios)" + (f"; {sp['model']} has random weights, timed only" if sp["random_weights"] else ""),
             f"{'method':<10}{'format':<7}{'bits/w':>7}{'MiB':>7}{'x fp16':>7}{'ppl':>8}{'delta':>8}"
             + "".join(f"{m + ' tok/s':>18}{'x fp32':>7}" for m in models) + ("  llama.cpp tok/s" if has_cpp else "")]
    for r in res["rows"]:
        line = (f"{r['name']:<10}{r['format']:<7}{r['bits_per_weight']:>7.2f}{r['weight_bytes'] / 2**20:>7.2f}"
                f"{r['bytes_ratio_vs_fp16']:>7.3f}{r['ppl']:>8.3f}{r['ppl_delta_pct']:>7.2f}%")
        for key in ("speed", "decode")[:len(models)]:
            rate, ratio = r[f"{key}_tokens_per_s"], r[f"{key}_vs_fp32"]
            line += f"{'skipped' if rate is None else f'{rate:.1f}':>18}{'' if ratio is None else f'{ratio:.2f}x':>7}"
        if r.get("llama_cpp_tokens_per_s"):
            line += f"  {r['llama_cpp_tokens_per_s']:>8.1f}"
        lines.append(line)
    skipped = {(m, f): v["skipped"] for m in models for f, v in sp["formats"][m].items() if "skipped" in v}
    lines += [f"skipped {f} on {m}: {why}" for (m, f), why in skipped.items()]
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
    p.add_argument("--speed-model", default=SPEED_MODEL, help="the model each weight format's decode speed is timed "
                   "on, beside the scored one (default: random-80m, memory-bound, random weights)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per speed run (default: 64)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the interleaved speed pass, best kept (default: 2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the speed pass (default: torch's)")
    p.add_argument("--methods", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="score rows in N processes; the speed pass runs alone "
                   "afterwards (default: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    args = p.parse_args(argv)
    if min(args.max_tokens or 1, args.calib_samples, args.new_tokens, args.repeats, args.jobs, args.threads or 1) < 1:
        p.error("--max-tokens, --calib-samples, --new-tokens, --repeats, --jobs and --threads must be >= 1")
    only = args.methods.split(",") if args.methods else None
    if only:
        from inferlab.quant.methods import resolve
        for m in only:
            resolve(m)
    from inferlab.model.loader import resolve_model_path
    resolve_model_path(args.speed_model)  # a wrong name fails now, not after scoring every row
    res = run(args.model, args.max_tokens, args.calib_samples, args.new_tokens, args.repeats, only,
              progress=True, jobs=args.jobs, speed_model=args.speed_model, threads=args.threads)
    print(json.dumps(res) if args.json else table(res))
    return 0
