"""Why decoding is memory-bound: bytes per token and the roofline model (Williams et al. 2009).

A decode step multiplies every weight matrix by one vector per sequence in the batch: about
2 FLOPs per parameter per sequence, while every weight byte must be read once per step. So

    time per step >= max(bytes_read / memory_bandwidth,  flops / peak_flops)

For a 70B model in fp16 the first term reads 140 GB per step; on an H100 (3.35 TB/s) that alone
caps a single stream at ~24 tokens/s, while its compute could do ~7,000. Prefill processes T
tokens per weight read, so its arithmetic intensity is ~T times higher: it is compute-bound.
"""
from __future__ import annotations

import dataclasses
import os
import time

import torch


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense FLOP/s at the precision that matters (bf16/fp16 tensor cores on GPUs)
    mem_bandwidth: float  # bytes/s
    memory_bytes: float

    def attainable_flops(self, intensity: float) -> float:
        """The roofline: min(peak FLOP/s, intensity x bandwidth) for ``intensity`` FLOPs per byte."""
        return min(self.peak_flops, intensity * self.mem_bandwidth)

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound on this machine."""
        return self.peak_flops / self.mem_bandwidth


# Datasheet figures: dense bf16 tensor-core throughput (no sparsity) and HBM/GDDR bandwidth.
PRESETS = {
    "A100 80GB SXM": Hardware("A100 80GB SXM", 312e12, 2.039e12, 80e9),
    "H100 SXM": Hardware("H100 SXM", 989e12, 3.35e12, 80e9),
    "H200 SXM": Hardware("H200 SXM", 989e12, 4.8e12, 141e9),
    "RTX 4090": Hardware("RTX 4090", 165e12, 1.008e12, 24e9),
}


def weight_bytes(num_params: float, bits_per_param: float) -> float:
    """Bytes needed to store the weights: 70e9 params at 16 bits -> 140e9 bytes."""
    return num_params * bits_per_param / 8


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_elem: float = 2) -> float:
    """K and V for one token across all layers: 2 * layers * kv_heads * head_dim * bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_elem


def decode_step_bytes(num_params: float, bits_per_param: float, batch: int = 1,
                      context: int = 0, kv_token_bytes: float = 0.0) -> float:
    """Bytes read by one decode step: the weights once, plus each sequence's cached K/V."""
    return weight_bytes(num_params, bits_per_param) + batch * context * kv_token_bytes


def decode_step_flops(num_params: float, batch: int = 1) -> float:
    """Matrix-vector work of one decode step: ~2 FLOPs per parameter per sequence."""
    return 2 * num_params * batch


def decode_tokens_per_s(hw: Hardware, num_params: float, bits_per_param: float, batch: int = 1,
                        context: int = 0, kv_token_bytes: float = 0.0) -> dict:
    """Roofline ceiling for decoding on ``hw``: tokens/s summed over the batch, and which bound wins."""
    t_mem = decode_step_bytes(num_params, bits_per_param, batch, context, kv_token_bytes) / hw.mem_bandwidth
    t_compute = decode_step_flops(num_params, batch) / hw.peak_flops
    step = max(t_mem, t_compute)
    return {"tokens_per_s": batch / step, "bound": "memory" if t_mem >= t_compute else "compute",
            "memory_s": t_mem, "compute_s": t_compute}


def arithmetic_intensity(num_params: float, bits_per_param: float, tokens_per_weight_read: int) -> float:
    """FLOPs per byte when ``tokens_per_weight_read`` tokens share one pass over the weights
    (1 for single-stream decode, the batch size for batched decode, the prompt length in prefill)."""
    return decode_step_flops(num_params, tokens_per_weight_read) / weight_bytes(num_params, bits_per_param)


def measure_this_machine(size: int = 1024, copy_mb: int = 256, repeats: int = 5, min_time_s: float = 0.2,
                         dtype=torch.float32, device="cpu") -> Hardware:
    """Measure this machine's matmul FLOP/s and memory-copy bandwidth: the best of ``repeats`` runs.

    Each run repeats ``size`` x ``size`` matmuls (and ``copy_mb`` MB copies) back to back for at
    least ``min_time_s`` seconds, so one slow call (another program taking the cores for a few
    milliseconds) cannot decide the result, and the best run is kept: the roof is an upper bound,
    so it should come from the quietest moment. On a shared machine it can still come out low;
    a measured point above it says so (see ``inferlab.viz.roofline_plot.above_roof``).
    """
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    src = torch.empty(copy_mb * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    # GPU kernels run asynchronously: wait for them, or the clock measures only the launch
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def rate(op, work: float, seconds: float) -> float:
        """``work`` per second over calls of ``op`` repeated for at least ``seconds``."""
        sync()
        calls, start = 0, time.perf_counter()
        while True:
            op()
            calls += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return calls * work / elapsed

    rate(lambda: a @ b, 0, 0)  # warm up: kernel selection, first-touch page faults
    rate(lambda: dst.copy_(src), 0, 0)
    flops = max(rate(lambda: a @ b, 2 * size**3, min_time_s) for _ in range(repeats))
    bandwidth = max(rate(lambda: dst.copy_(src), 2 * src.numel() * 4, min_time_s)  # a copy reads and writes
                    for _ in range(repeats))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return Hardware("this machine", flops, bandwidth, float(memory))
