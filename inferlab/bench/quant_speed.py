"""``bench quant``'s speed pass: every weight format's decode speed, timed together, as ratios to fp32.

Decode speed belongs to a weight *format*, not to a quantization method: the format decides the
kernel. GPTQ, AWQ and 3-bit INT4 checkpoints load as INT4 codes (nibbles, g128) and run int4's
kernel (GPTQ's act-order adds one gather of each input; AWQ's scales are folded into the previous
norm), so one speed per format is honest. Every (model, format) variant is built, held in memory,
and timed in ONE pass of alternating rounds with ``bench decode``'s timing code
(:func:`inferlab.bench.stats.best_rates`): a shared machine's load changes from minute to minute,
and only ratios measured side by side survive it. The speed model is ``random-80m`` (random weights
in a realistic shape, 315 MB in fp32, too big for the caches: memory-bound, as a real LLM is); the
embedded target fits in cache, so fewer bytes per weight save it no time (the unpacking still costs).
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile

from inferlab.bench.decode import PROMPT, _llama_cpp_run, _variant, engine_run, weight_bytes_per_token
from inferlab.bench.stats import best_rates
from inferlab.quant.base import QuantizationError

SPEED_MODEL = "random-80m"
FORMAT_OF = {"gptq": "int4", "awq": "int4"}  # the kernel a method's checkpoint runs (all else: its own)
GGUF = ("fp32", "q8_0", "q4_0", "q4_k")  # the formats llama.cpp also runs (fp32 as an F32 .gguf)


def format_of(method: str) -> str:
    return FORMAT_OF.get(method, method)


def speed_pass(models: list[str], formats: list[str], new_tokens: int, repeats: int) -> dict:
    """Decode tokens/s of every (model, format), all held in memory and timed in ONE interleaved pass
    (``best_rates``: a warm-up each, then ``repeats`` rounds over all of them in turn, best of each), so
    each ratio to the same model's fp32 is measured under the same machine load.
    Returns {model: {format: {"tokens_per_s", "vs_fp32", "weight_mb"} or {"skipped": why}}}."""
    llms, runs, out = {}, {}, {m: {} for m in models}
    for model in models:
        for fmt in formats:
            try:
                llms[model, fmt] = _variant(model, fmt)  # the same variants as bench decode
            except QuantizationError as exc:  # e.g. q4_k's 256-value blocks on a narrow model
                out[model][fmt] = {"skipped": str(exc)}
                continue
            runs[model, fmt] = engine_run(llms[model, fmt], llms[model, fmt].encode(PROMPT))
    rates = best_rates(runs, new_tokens, repeats)
    for (model, fmt), rate in rates.items():
        base = rates.get((model, "fp32"))
        out[model][fmt] = {"tokens_per_s": round(rate, 1), "vs_fp32": None if base is None else round(rate / base, 2),
                           "weight_mb": round(weight_bytes_per_token(llms[model, fmt].model) / 2**20, 1)}
    for (model, fmt), llm in llms.items():
        if fmt in GGUF and importlib.util.find_spec("llama_cpp") is not None:
            out[model][fmt]["llama_cpp_tokens_per_s"] = _llama_cpp_tokens_per_s(llm, fmt, new_tokens, repeats)
    return {m: {f: out[m][f] for f in formats if f in out[m]} for m in models}


def _llama_cpp_tokens_per_s(llm, fmt: str, new_tokens: int, repeats: int) -> float | None:
    """llama.cpp's own timing of a greedy decode of the same weights, best of ``repeats`` (``bench
    decode``'s llama.cpp run); None if it fails, said on stderr."""
    from inferlab.quant import llama_cpp_runner
    with tempfile.TemporaryDirectory() as tmp:
        run = _llama_cpp_run(llm, fmt, llm.encode(PROMPT), new_tokens, tmp)
        try:
            return round(max(run() for _ in range(repeats)), 1)
        except llama_cpp_runner.LlamaCppError as exc:
            print(f"inferlab bench quant: {exc}", file=sys.stderr)
            return None


def speed_goals(speeds: dict, model: str) -> dict:
    """The speed targets on the (memory-bound) speed model: int8 and int4 decode faster than fp32."""
    out = {}
    for fmt in ("int8", "int4"):
        ratio = speeds.get(fmt, {}).get("vs_fp32")
        if ratio is not None:
            out[f"{fmt}_speed_vs_fp32"] = g = {"value": ratio, "target": "> 1", "met": ratio > 1}
            if not g["met"]:
                g["why"] = (f"{fmt} decodes at {ratio}x fp32 on {model}: its kernel reads fewer bytes but spends more "
                            f"per byte than fp32's GEMV on this CPU (`inferlab bench decode` shows the profile)")
    return out
