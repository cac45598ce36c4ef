"""Small statistics shared by the benchmarks (one home, so the benchmarks need not import each other)."""
from __future__ import annotations

import statistics
import time

import torch


def best_time(fn, repeats: int, warmup: bool = False) -> float:
    """The shortest of ``repeats`` timed calls of ``fn`` (after one untimed call with ``warmup``):
    on a shared CPU the minimum is the run least disturbed by others."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def best_times(fns: dict, repeats: int, warmup: bool = True) -> dict:
    """The shortest of ``repeats`` timed calls of each of ``fns`` ({name: fn}), called in turn, one
    of each a round: a ratio of two of them then compares calls made under the same load, where
    timing one fn's calls and then the other's lets a burst of other work land on one side only."""
    if warmup:
        for fn in fns.values():
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between ranks as numpy's default; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def is_decode_step(record: dict) -> bool:
    """Does every sequence in this step record compute one token (no prompt, no chunk of one)?"""
    return all(row["kind"] == "decode" for row in record["scheduled"])


def decode_step_seconds(records: list[dict], key: str = "seconds") -> dict[int, float]:
    """Median seconds (``record[key]``) of a decode-only step (every sequence computes one token),
    by the number of sequences in it, over step ``records``."""
    by_size: dict[int, list[float]] = {}
    for rec in records:
        if is_decode_step(rec):
            by_size.setdefault(len(rec["scheduled"]), []).append(rec[key])
    return {b: statistics.median(s) for b, s in sorted(by_size.items())}


def mean_decode_batch(records: list[dict]) -> float:
    """Sequences decoding per step, over the steps that decode any (the vLLM paper's Fig. 13
    "average number of batched requests")."""
    sizes = [n for n in (sum(row["kind"] == "decode" for row in r["scheduled"]) for r in records) if n]
    return statistics.fmean(sizes) if sizes else 0.0


def step_split(records: list[dict]) -> dict:
    """Where a run's step time went: steps that compute a prompt (a new request's, or one recomputed
    after preemption, with any decodes beside it) against steps that only decode, and the decode
    steps' own tokens per second (one token per sequence per step). On a GPU a prompt's tokens cost
    a small part of a decode step each; on a CPU they cost about as much as a decode row, so the
    prompts, the same work for every system, weigh on tokens/s and flatten the ratios between them."""
    decode = [r for r in records if is_decode_step(r)]
    decode_s = sum(r["seconds"] for r in decode)
    prompt_s = sum(r["seconds"] for r in records) - decode_s
    return {"prompt_step_s": prompt_s, "decode_step_s": decode_s,
            "prompt_share": prompt_s / (prompt_s + decode_s) if prompt_s + decode_s else 0.0,
            "prompt_tokens_computed": sum(row["num_new_tokens"] for r in records for row in r["scheduled"]
                                          if row["kind"] != "decode"),
            "decode_tokens_per_s": sum(len(r["scheduled"]) for r in decode) / decode_s if decode_s else 0.0}


def step_costs(records: list[dict], key: str = "seconds") -> dict[str, float]:
    """What a step's time grows with: the least-squares fit of every step's seconds (``record[key]``) as a fixed
    cost per step, a cost per sequence in it and a cost per token it computes beyond one per
    sequence (prompt tokens).

    Both policies do the same work on one workload (the same sequence-steps, the same tokens), so
    fewer steps save only the fixed part: continuous / static tokens/s is (fixed * static steps +
    work) / (fixed * continuous steps + work), the step ratio only when the fixed part dominates."""
    x = torch.tensor([[1.0, len(r["scheduled"]), r["num_batched_tokens"] - len(r["scheduled"])] for r in records],
                     dtype=torch.float64)
    y = torch.tensor([[r[key]] for r in records], dtype=torch.float64)
    fixed, per_seq, per_token = torch.linalg.lstsq(x, y).solution[:, 0].tolist()
    return {"fixed_s": fixed, "per_seq_s": per_seq, "per_token_s": per_token,
            "fixed_share": fixed * len(records) / float(y.sum())}


def best_rates(runs: dict, new_tokens: int, repeats: int, decode_only: bool = True) -> dict:
    """Tokens/s of each ``runs[name](n)`` (one generate of n new tokens): one warm-up each, then
    ``repeats`` rounds in turn, best time of each. ``decode_only``: each round also times n = 1
    (prefill and one token), and the rate is (new_tokens - 1) / (best t(new_tokens) - best t(1)),
    so a slow prefill (a quantized prompt that no loop takes dequantizes its weights) does not hide
    the decode speed.
    The one timing code of ``bench decode`` and ``bench quant``."""
    decode_only = decode_only and new_tokens > 1
    sizes = (new_tokens, 1) if decode_only else (new_tokens,)
    best = {(name, n): float("inf") for name in runs for n in sizes}
    for name, fn in runs.items():
        fn(new_tokens)
    for _ in range(repeats):
        for (name, n) in best:
            t = time.perf_counter()
            runs[name](n)
            best[name, n] = min(best[name, n], time.perf_counter() - t)
    if not decode_only:
        return {name: new_tokens / best[name, new_tokens] for name in runs}
    rates = {}
    for name in runs:  # under load the best one-token run can come out no faster than the long one:
        long, short = best[name, new_tokens], best[name, 1]  # then take the whole run's rate
        rates[name] = (new_tokens - 1) / (long - short) if long > 1.05 * short else new_tokens / long
    return rates
