"""``inferlab bench NAME``: benchmarks that run a baseline in the same process and print ratios.

These machines are shared and noisy, so absolute times mean little; a ratio of two runs made
side by side, best of several repeats, is what each benchmark reports.
"""
from __future__ import annotations

BENCHES = {
    "decode": ("inferlab.bench.decode", "single-stream greedy decode: inferlab vs transformers"),
    "quant": ("inferlab.bench.quant", "every quantization method: bytes, perplexity, decode speed"),
    "rows": ("inferlab.bench.rows", "what more rows cost: every layer projection at 1, 2, 5, 9, 17 rows, per format"),
    "kv": ("inferlab.bench.kv", "KV-cache memory wasted: contiguous vs paged, prefix sharing"),
    "serve": ("inferlab.bench.serve", "continuous vs static batching on one workload; --url: any OpenAI server"),
    "spec": ("inferlab.bench.spec", "speculative decoding at batch 1: measured vs predicted speedup (n-gram, draft)"),
    "gqa": ("inferlab.bench.gqa", "MHA vs GQA vs MQA: KV bytes, sequences per KV budget, decode speed, perplexity"),
    "structured": ("inferlab.bench.structured", "structured outputs on smollm2: grammar mask cost per token (xgrammar, llguidance), JSON answers"),
    "tp": ("inferlab.bench.tp", "tensor parallelism: decode step at TP=1 vs TP=2, all-reduces per step, load memory per rank"),
}


def main(argv: list[str]) -> int:
    from inferlab.cli import dispatch

    return dispatch("inferlab bench", BENCHES, argv, noun="benchmark")
