"""Small helpers the kernel files share: input checks, launch configs, timing."""
from __future__ import annotations

import os
import time

import torch

from inferlab.kernels import INTERPRETED

HEAD_DIMS = (16, 32, 64, 128)


def check_head_dim(d: int) -> None:
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported: use one of {HEAD_DIMS}")


def check_dtype(*tensors: torch.Tensor) -> None:
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            raise ValueError(f"all inputs must share one dtype, got {t.dtype} and {dtype}: cast them first")
    if INTERPRETED and dtype != torch.float32:
        raise ValueError(f"Triton's CPU interpreter needs float32 inputs, got {dtype}: call .float() first")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype {dtype} is not supported: use float32, float16 or bfloat16")


def maybe_autotune(configs, key, **autotune_kw):
    """``triton.autotune`` on a GPU. In the interpreter the first config, untuned (tuning runs the
    kernel once per config, about 1000x slower than compiled there); with the environment variable
    INFERLAB_KERNEL_AUTOTUNE=0 the second config, untuned (quick GPU tests: one compile per kernel)."""
    import triton

    def fixed(fn, config):
        class Fixed:
            def __getitem__(self, grid):
                def launch(*args, **kw):
                    opts = {"num_warps": config.num_warps, "num_stages": config.num_stages} if not INTERPRETED else {}
                    return fn[grid](*args, **{**config.kwargs, **opts, **kw})
                return launch

        return Fixed()

    def wrap(fn):
        if INTERPRETED:
            return fixed(fn, configs[0])
        if os.environ.get("INFERLAB_KERNEL_AUTOTUNE", "1") == "0":
            return fixed(fn, configs[1])
        return triton.autotune(configs=configs, key=key, **autotune_kw)(fn)

    return wrap


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def time_ms(fn, warmup: int = 3, rep: int = 20) -> float:
    """Median milliseconds of ``fn()``: triton.testing.do_bench on a GPU, a wall clock on CPU."""
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def sdpa_flash(q, k, v, causal=False):
    """The baseline: SDPA restricted to its FlashAttention backend, GQA without copying K/V where
    this torch allows it (else K/V repeated per query head, outside the timed call)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(k_, v_, **kw):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k_, v_, is_causal=causal, **kw)

    if q.shape[1] == k.shape[1]:
        return lambda: run(k, v)
    try:
        run(k, v, enable_gqa=True)
        return lambda: run(k, v, enable_gqa=True)
    except RuntimeError:
        g = q.shape[1] // k.shape[1]
        k_rep, v_rep = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        return lambda: run(k_rep, v_rep)
