"""From the measured workload to GPUs: Little's law and the roofline (notebook 00), nothing else.

    concurrency at the peak   L = lambda_peak x W      (Little 1961: requests in the system = arrival
                                                         rate x time each one spends there)
    W                         TTFT + output_tokens x TPOT
    one decode step           reads the weights once + every running sequence's K/V (memory-bound),
                              at ``efficiency`` of the datasheet bandwidth
    sequences per GPU         the most whose step still meets the TPOT target and whose K/V fit
    GPUs                      L / sequences per GPU, plus the share of time prefill takes

Every number that is not computed here is an assumption passed in, so a notebook can list them
all in one place. These are ceilings: a real server also pays for scheduling, sampling and
imperfect kernels, which is what ``efficiency`` stands for.
"""
from __future__ import annotations

import math

from inferlab.roofline import Hardware, kv_bytes_per_token


def littles_law(requests_per_day: float, peak_to_average: float, ttft_s: float, output_tokens: float,
                tpot_s: float) -> dict:
    rate = requests_per_day / 86_400 * peak_to_average
    w = ttft_s + output_tokens * tpot_s
    return {"peak_rate": rate, "time_in_system_s": w, "concurrency": rate * w}


def step_seconds(hw: Hardware, params: float, bits: float, batch: int, context: int, kv_token: float,
                 efficiency: float = 1.0) -> float:
    """One decode step of ``batch`` sequences of ``context`` tokens: the slower of memory and compute."""
    memory = (params * bits / 8 + batch * context * kv_token) / (hw.mem_bandwidth * efficiency)
    compute = 2 * params * batch / (hw.peak_flops * efficiency)
    return max(memory, compute)


def max_batch(hw: Hardware, params: float, bits: float, context: int, kv_token: float, tpot_s: float,
              efficiency: float = 1.0, memory_fraction: float = 0.9, limit: int = 4096) -> int:
    """The most sequences one GPU decodes at once with a step <= ``tpot_s`` and K/V that fit beside the weights."""
    free = hw.memory_bytes * memory_fraction - params * bits / 8
    if free <= 0:
        return 0
    fit = int(free // (context * kv_token))
    best = 0
    for b in range(1, min(fit, limit) + 1):
        if step_seconds(hw, params, bits, b, context, kv_token, efficiency) > tpot_s:
            break
        best = b
    return best


def gpus_needed(concurrency: float, per_gpu: int, prefill_share: float) -> int:
    """GPUs to hold ``concurrency`` sequences when ``prefill_share`` of each GPU's time goes to prompts."""
    if per_gpu <= 0 or prefill_share >= 1:
        return 0  # does not fit at all: report as impossible
    return max(1, math.ceil(concurrency / (per_gpu * (1 - prefill_share))))


def prefill_share(hw: Hardware, params: float, peak_rate: float, prompt_tokens: float, efficiency: float = 0.5) -> float:
    """Share of one GPU's time spent on prompts at the peak (compute-bound: 2 FLOPs per parameter per token)."""
    return peak_rate * prompt_tokens * 2 * params / (hw.peak_flops * efficiency)


def llama_kv_token(num_layers: int = 32, num_kv_heads: int = 8, head_dim: int = 128, bytes_per_elem: float = 2) -> float:
    """K/V bytes per token of a Llama-3-8B-shaped model (GQA, 8 KV heads) by default."""
    return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_elem)
