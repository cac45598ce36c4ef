"""Batch-1 greedy decode, every engine and precision side by side, with the course's speed goals checked.

For each model (``target``, and ``random-80m``: random weights of realistic shape, timed only)
and each precision (fp32, fp16, int8, int4 g128, q8_0, q4_k), the columns are: inferlab's engine
(``LLM.generate``: scheduler, paged KV cache), the same engine with its decode step compiled
(``enforce_eager=False``, fp32, int8 and int4 rows: one graph per batch size), its contiguous-cache reference path
(``inferlab.generate``), transformers ``generate`` (fp32/fp16), and llama.cpp on a GGUF of the
same weights when ``llama-cpp-python`` is installed (as many threads as this process). ``--model smollm2
--precisions stored,fp32,...``: a GGUF as the file holds it, beside llama.cpp on that very file.
Every run decodes the same prompt (EOS ignored) for ``--new-tokens`` tokens and for 1; the decode
rate is the difference (prefill excluded: it differs by format and by CPU). The runs of
one model are interleaved, round-robin, each keeping its best of ``--repeats`` (after a warm-up that
also compiles the quantized kernels): a shared machine makes absolute times noisy, ratios less so.
``bandwidth_fraction``: bytes read per token x tokens/s over the copy bandwidth notebook 00 measures.
``--sampler``: the cost of a sampled step against a greedy one at batch 32.
"""
from __future__ import annotations

import argparse
import os

from inferlab.cli import HelpFormatter
import importlib.util
import json
import tempfile

import torch

from inferlab.model import gguf_loader
from inferlab.bench.stats import best_rates
from inferlab.errors import InferlabError
from inferlab.model.loader import hf_model_folder, resolve_model_path
from inferlab.quant.base import QuantizationError

PROMPT = "def fibonacci(n):\n    "
MODELS = ("target", "random-80m")
PRECISIONS = ("fp32", "fp16", "int8", "int4", "q8_0", "q4_k")
# "stored": a GGUF's blocks as the file holds them (smollm2's Q4_1), beside llama.cpp on the same file
# "<method>+head": the output head quantized too (Q8_0 or INT8, ``quantize_model(quantize_head=True)``)
HEADED = ("int8", "int4", "q8_0", "q4_0", "q4_1", "q4_k", "nf4")
CHOICES = PRECISIONS + ("q4_0", "q4_1", "nf4", "stored") + tuple(f"{m}+head" for m in HEADED)
COMPILED = ("fp32", "int8", "int4")  # also timed with a compiled decode step (each compiles for a minute)
GOALS = [  # (model, what, ratio key, threshold)
    ("random-80m", "fp32 >= 0.8x llama.cpp F32", ("fp32", "engine", "fp32", "llama.cpp"), 0.8),
    ("random-80m", "int8 >= 2x inferlab fp32", ("int8", "engine", "fp32", "engine"), 2.0),
    ("random-80m", "int8 >= 0.8x llama.cpp Q8_0", ("int8", "engine", "q8_0", "llama.cpp"), 0.8),
    ("random-80m", "int8, compiled step >= 0.8x llama.cpp Q8_0", ("int8", "compiled", "q8_0", "llama.cpp"), 0.8),
    ("random-80m", "int4 >= 3x inferlab fp32", ("int4", "engine", "fp32", "engine"), 3.0),
    ("random-80m", "int8, compiled step >= 2x fp32, compiled step", ("int8", "compiled", "fp32", "compiled"), 2.0),
    ("random-80m", "int4, compiled step >= 3x fp32, compiled step", ("int4", "compiled", "fp32", "compiled"), 3.0),
    # the real model (--model smollm2): memory-bound, deep and narrow (30 layers of 576)
    ("smollm2", "fp32 >= 0.8x llama.cpp F32", ("fp32", "engine", "fp32", "llama.cpp"), 0.8),
    ("smollm2", "fp32, compiled step >= 0.8x llama.cpp F32", ("fp32", "compiled", "fp32", "llama.cpp"), 0.8),
    ("smollm2", "as stored (Q4_1) >= 0.8x llama.cpp on the same file", ("stored", "engine", "stored", "llama.cpp"), 0.8),
    ("smollm2", "q8_0 >= 0.8x llama.cpp Q8_0", ("q8_0", "engine", "q8_0", "llama.cpp"), 0.8),
    ("smollm2", "q8_0, head too >= 0.8x llama.cpp on the same file", ("q8_0+head", "engine", "q8_0+head", "llama.cpp"), 0.8),
    ("smollm2", "int8 >= 2x inferlab fp32", ("int8", "engine", "fp32", "engine"), 2.0),
    ("smollm2", "int4 >= 3x inferlab fp32", ("int4", "engine", "fp32", "engine"), 3.0),
    ("target", "fp32 >= 0.5x llama.cpp F32", ("fp32", "engine", "fp32", "llama.cpp"), 0.5),
    ("target", "fp32, compiled step >= 0.5x llama.cpp F32", ("fp32", "compiled", "fp32", "llama.cpp"), 0.5),
    ("target", "engine >= 1.0x contiguous", ("fp32", "engine", "fp32", "contiguous"), 1.0),
    ("target", "engine, compiled step >= 1.0x contiguous", ("fp32", "compiled", "fp32", "contiguous"), 1.0),
    ("random-80m", "engine >= 1.0x contiguous", ("fp32", "engine", "fp32", "contiguous"), 1.0),
    ("random-80m", "engine, compiled step >= 1.0x contiguous", ("fp32", "compiled", "fp32", "contiguous"), 1.0),
]


def engine_run(llm, ids: list[int]):
    """A callable: one batch-1 greedy generate of exactly n new tokens through the engine."""
    from inferlab.sampling import SamplingParams

    def run(n: int):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        out = llm.generate(prompt_token_ids=[ids], sampling_params=params)
        assert len(out[0].outputs[0].token_ids) == n
    return run


def _variant(model: str, precision: str, enforce_eager: bool = True):
    from inferlab.llm import LLM
    if precision == "stored":
        return LLM(model=model, device="cpu", dtype="float32", max_num_seqs=1, enforce_eager=enforce_eager)
    if precision in ("fp32", "fp16"):  # quantization "none": a GGUF's blocks dequantized
        return LLM(model=model, device="cpu", dtype={"fp32": "float32", "fp16": "float16"}[precision], max_num_seqs=1,
                   enforce_eager=enforce_eager, quantization="none")
    method, _, head = precision.partition("+")
    llm = LLM(model=model, device="cpu", dtype="float32", quantization=method, max_num_seqs=1,
              enforce_eager=enforce_eager)
    if head:  # the head too, as quantize_model(quantize_head=True) stores it
        from inferlab.quant.quantize import quantize_output_head
        quantize_output_head(llm.model, method)
    return llm


def _runs(model: str, precision: str, llm, ids: list[int], new_tokens: int, tmp: str, compiled: bool = True) -> dict:
    from inferlab.generate import generate
    from inferlab.sampling import SamplingParams
    runs = {"engine": engine_run(llm, ids)}
    if compiled and precision in COMPILED:
        runs["compiled"] = engine_run(_variant(model, precision, enforce_eager=False), ids)

    def contiguous(n: int):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        seq = generate(llm.model, [ids], [params], llm.eos_token_ids, llm.tokenizer)[0]
        assert len(seq.output_token_ids) == n
    runs["contiguous"] = contiguous
    if precision in ("fp32", "fp16"):
        runs["transformers"] = _hf_run(model, llm, ids, new_tokens)
    if importlib.util.find_spec("llama_cpp") is not None:
        if precision.partition("+")[0] in ("fp32", "q8_0", "q4_0", "q4_1", "q4_k"):  # "+head": its head written quantized too
            runs["llama.cpp"] = _llama_cpp_run(llm, precision, ids, new_tokens, tmp)
        elif precision == "stored" and gguf_loader.is_gguf(path := resolve_model_path(model)):
            from inferlab.quant import llama_cpp_runner  # llama.cpp on the very file
            runs["llama.cpp"] = lambda: llama_cpp_runner.run(path, ids, new_tokens,
                                                             threads=torch.get_num_threads())["tokens_per_s"]
    return runs


def _hf_run(model: str, llm, ids, new_tokens):
    import transformers
    # a GGUF: transformers reads the same fp32 weights from its cached HF folder
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_model_folder(model), dtype=llm.model.dtype).eval()
    x = torch.tensor([ids])
    pad = llm.eos_token_ids[0] if llm.eos_token_ids else 0

    def run(n: int):
        with torch.inference_mode():
            out = hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)
        assert out.shape[1] - x.shape[1] == n
    return run


def _llama_cpp_run(llm, precision, ids, new_tokens, tmp):
    """llama.cpp's own timing of a greedy decode of the same GGUF weights."""
    from inferlab.quant import llama_cpp_runner
    from inferlab.quant.gguf_export import write_gguf
    method = precision.partition("+")[0]
    path = write_gguf(llm.model, llm.tokenizer, f"{tmp}/{precision}", "f32" if method == "fp32" else method)

    # it times its own decode, with as many threads as this process has
    return lambda: llama_cpp_runner.run(path, ids, new_tokens, threads=torch.get_num_threads())["tokens_per_s"]


def weight_bytes_per_token(model, float_bytes: int | None = None) -> int:
    """Bytes a decode step reads from weights: every parameter and buffer, the (tied) embedding once;
    an embedding table the head does not share is a lookup (one row per token) and is left out.
    ``float_bytes``: price floating-point tensors at most this many bytes a value (2: fp32 weights
    as the fp16 a GPU would read)."""
    seen, total = set(), 0
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.data_ptr() in seen or "rotary" in name or name.endswith(("inv_freq", "cos", "sin", "perm", "guess_vocab")):
            continue
        if name == "model.embed_tokens.weight" and (head is None or head.data_ptr() != t.data_ptr()):
            continue
        seen.add(t.data_ptr())
        size = t.element_size()
        total += t.numel() * (min(size, float_bytes) if float_bytes and t.is_floating_point() else size)
    return total


def run(models=MODELS, precisions=PRECISIONS, new_tokens: int = 64, repeats: int = 3, threads: int | None = None,
        bandwidth: float | None = None, compiled: bool = True) -> dict:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise InferlabError("the decode benchmark compares against transformers: pip install transformers") from None
    from inferlab.model import random_model
    if threads:  # fixed, as llama.cpp's: the engine does not hand cores to other programs here
        torch.set_num_threads(threads)
        os.environ["INFERLAB_CPU_SHARE"] = "0"
    if bandwidth is None:
        from inferlab.roofline import measure_this_machine
        bandwidth = measure_this_machine(size=256).mem_bandwidth  # notebook 00's copy bandwidth
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            llms, runs = {}, {}
            for p in precisions:
                try:
                    llms[p] = _variant(model, p)
                except QuantizationError as exc:  # e.g. a block size that does not divide a tiny model
                    rows.append({"model": model, "precision": p, "skipped": str(exc)})
                    continue
                ids = llms[p].encode(PROMPT)
                for col, fn in _runs(model, p, llms[p], ids, new_tokens, tmp, compiled).items():
                    runs[(p, col)] = fn
            llama = {k: runs.pop(k) for k in [k for k in runs if k[1] == "llama.cpp"]}
            rates = best_rates(runs, new_tokens, repeats)
            rates.update({k: max(fn() for _ in range(repeats)) for k, fn in llama.items()})
            for p in llms:
                nbytes = weight_bytes_per_token(llms[p].model)
                row = {"model": model, "random_weights": random_model.is_random_model(model),
                       "params": llms[p].model.num_parameters(), "precision": p, "weight_mb": round(nbytes / 2**20, 1)}
                for (q, col), r in rates.items():
                    if q == p:
                        row[f"{col}_tokens_per_s"] = round(r, 1)
                row["bandwidth_fraction"] = round(row["engine_tokens_per_s"] * nbytes / bandwidth, 3)
                rows.append(row)
    goals = []
    for model, what, (p1, c1, p2, c2), need in GOALS:
        a, b = rates_of(rows, model, p1, c1), rates_of(rows, model, p2, c2)
        ratio = None if a is None or b is None else a / b
        why = None
        if ratio is None:
            why = ("llama-cpp-python is not installed" if "llama.cpp" in (c1, c2) and importlib.util.find_spec(
                "llama_cpp") is None else "not measured in this run (--model/--precisions)")
        goals.append({"model": model, "goal": what, "measured": None if ratio is None else round(ratio, 2),
                      "met": None if ratio is None else ratio >= need, "why_not_measured": why,
                      "why_missed": why_missed(rows, model, p1, c1, p2, c2, need) if ratio is not None and ratio < need else None})
    out = {"threads": torch.get_num_threads(), "new_tokens": new_tokens, "repeats": repeats,
           "memory_bandwidth_gb_s": round(bandwidth / 1e9, 1), "rows": rows, "goals": goals}
    first = next((r for r in rows if r["precision"] == "fp32" and "skipped" not in r), None)
    if first is not None and "transformers_tokens_per_s" in first:  # the first model's fp32 row, as before
        out.update(model=first["model"], inferlab_tokens_per_s=first["engine_tokens_per_s"],
                   hf_tokens_per_s=first["transformers_tokens_per_s"],
                   inferlab_over_hf_tokens_per_s=round(first["engine_tokens_per_s"] / first["transformers_tokens_per_s"], 3),
                   contiguous_tokens_per_s=first["contiguous_tokens_per_s"],
                   engine_over_contiguous_tokens_per_s=round(first["engine_tokens_per_s"] / first["contiguous_tokens_per_s"], 3))
    return out


def why_missed(rows, model, p1, c1, p2, c2, need) -> str | None:
    """Where a format misses its speed-up over another in the same engine, what the bytes allow: a
    decode step reads every weight once, so at equal use of the memory's bandwidth the speed-up is
    the ratio of the bytes a token reads; each format's share of the bandwidth says how far it is
    from that, and a quantized head (``<format>+head``, where measured) what the float head costs."""
    if c1 != "engine" or c2 != "engine":
        return None
    r1, r2 = _row(rows, model, p1), _row(rows, model, p2)
    bound = r2["weight_mb"] / r1["weight_mb"]
    text = (f"the weights allow {bound:.2f}x ({r2['weight_mb']} MB a token against {r1['weight_mb']}), "
            + ("below the goal even at equal bandwidth; " if bound < need else "")
            + f"{p1} reads at {r1['bandwidth_fraction']:.0%} of the copy bandwidth, {p2} at {r2['bandwidth_fraction']:.0%}")
    headed = rates_of(rows, model, f"{p1}+head", "engine")
    if headed is not None:
        text += (f"; with the head quantized too ({p1}+head, {_row(rows, model, p1 + '+head')['weight_mb']} MB): "
                 f"{headed / rates_of(rows, model, p2, 'engine'):.2f}x")
    return text


def _row(rows, model, precision) -> dict:
    return next(r for r in rows if r["model"] == model and r["precision"] == precision and "skipped" not in r)


def rates_of(rows, model, precision, column):
    for r in rows:
        if r["model"] == model and r["precision"] == precision and "skipped" not in r:
            return r.get(f"{column}_tokens_per_s")
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench decode", description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default=",".join(MODELS), help="comma-separated: embedded names, random-80m, folders")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated weight formats to time "
                   f"({', '.join(CHOICES)}; stored: a GGUF's own blocks, e.g. --model smollm2)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 64 (16 with --sampler)")
    p.add_argument("--repeats", type=int, default=None, help="default 3 (7 with --sampler)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--eager-only", action="store_true", help="skip the compiled-decode column (saves its compile)")
    p.add_argument("--sampler", action="store_true", help="sampled vs greedy decode at batch 32 instead")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    args = p.parse_args(argv)
    if args.new_tokens is None:
        args.new_tokens = 16 if args.sampler else 64
    if args.repeats is None:
        args.repeats = 7 if args.sampler else 3
    if args.new_tokens < 1 or args.repeats < 1:
        p.error("--new-tokens and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sampler:
        from inferlab.bench.sampler import sampler_cost
        r = sampler_cost(args.model.split(",")[0] if args.model != ",".join(MODELS) else "draft",
                         new_tokens=args.new_tokens, repeats=args.repeats)
        print(json.dumps(r) if args.json else
              f"{r['model']} batch {r['batch']}: sampled step cost vs greedy "
              + ", ".join(f"{k} {v:.2f}x" for k, v in r["cost_vs_greedy"].items())
              + f"  (goal <= 1.3x: {'met' if r['met'] else 'missed'})")
        return 0
    bad = [q for q in args.precisions.split(",") if q not in CHOICES]
    if bad:
        p.error(f"unknown precision {bad[0]!r}: choose from {', '.join(CHOICES)}")
    r = run(args.model.split(","), args.precisions.split(","), args.new_tokens, args.repeats, args.threads,
            compiled=not args.eager_only)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"batch-1 greedy decode, {r['new_tokens']} new tokens, {r['threads']} thread(s), best of {r['repeats']}, "
          f"copy bandwidth {r['memory_bandwidth_gb_s']} GB/s (shared machine: compare ratios)")
    cols = ["engine", "compiled", "contiguous", "transformers", "llama.cpp"]
    print(f"{'model':<20}{'prec':<6}{'MB':>7}" + "".join(f"{c:>14}" for c in cols) + f"{'of BW':>8}")
    for row in r["rows"]:
        if "skipped" in row:
            print(f"{row['model']:<20}{row['precision']:<6} skipped: {row['skipped']}")
            continue
        cells = "".join(f"{row.get(c + '_tokens_per_s', '-'):>14}" for c in cols)
        label = row["model"] + (" (random)" if row["random_weights"] and row["precision"] == "fp32" else "")
        print(f"{label:<20}{row['precision']:<6}{row['weight_mb']:>7}{cells}{row['bandwidth_fraction']:>8.0%}")
    for g in r["goals"]:
        state = f"n/a ({g['why_not_measured']})" if g["met"] is None else ("met" if g["met"] else "missed")
        print(f"goal {g['model']}: {g['goal']}: {g['measured'] if g['measured'] is not None else '-'} {state}"
              + (f" ({g['why_missed']})" if g.get("why_missed") else ""))
    return 0
