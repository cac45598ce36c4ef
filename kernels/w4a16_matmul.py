"""W4A16 matmul in Triton: 4-bit weights dequantized on the fly, 16-bit activations.

Decoding one token multiplies a vector by every weight matrix, so its time is the time to read
the weights (a few FLOPs per byte: memory-bound, see notebook 00). Storing them in 4 bits reads
4x fewer bytes than fp16, but only if they are never written back out in fp16: dequantizing
first and then calling a matmul reads 4 bits, writes 16, reads 16 again. This kernel loads the
packed bytes into registers, unpacks and rescales them there, and multiplies at once
(as in GPTQ's and AWQ's CUDA kernels, or gpt-fast's int4 path).

Layout (INT4 group-wise, asymmetric, G weights per group along the input dimension):
``qweight`` uint8 [N, K // 2], byte [n, j] = q[n, 2j] | (q[n, 2j+1] << 4) (low nibble = even
column), codes 0..15; ``scales`` float16 [N, K // G]; ``zeros`` uint8 [N, K // G], 0..15;
w[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G].  y = x @ w^T, x [M, K] -> y [M, N].
"""
from __future__ import annotations

import torch

import inferlab.kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from inferlab.kernels._util import check_dtype, maybe_autotune, next_pow2, time_ms

# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages): the first is the interpreter's
_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w, num_stages=s)
            for bm, bn, bk, sk, w, s in [(16, 32, 32, 1, 4, 1),
                                         (16, 64, 128, 4, 4, 4), (16, 32, 256, 4, 4, 3), (16, 128, 128, 2, 4, 4),
                                         (16, 64, 256, 8, 4, 3), (16, 32, 128, 8, 2, 4),
                                         (64, 64, 64, 1, 4, 4), (128, 128, 64, 1, 8, 3), (128, 64, 64, 1, 4, 4)]]


@maybe_autotune(_CONFIGS, key=["M_BUCKET", "N", "K"], reset_to_zero=["Out"])
@triton.jit
def _w4a16_kernel(X, QWeight, Scales, Zeros, Out, M, N, K, M_BUCKET, sxm, sqn, ssn, szn, som,
                  GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)  # split-K: SPLIT_K programs share one output tile (matrix-vector)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + offs_m[:, None] * sxm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w_ok = (offs_k[:, None] < K) & (offs_n[None, :] < N)
        packed = tl.load(QWeight + offs_n[None, :] * sqn + offs_k[:, None] // 2, mask=w_ok, other=0)
        q = (packed >> ((offs_k[:, None] % 2) * 4).to(tl.uint8)) & 0xF  # [BLOCK_K, BLOCK_N] codes
        if BLOCK_K <= GROUP_SIZE:  # the whole tile lies in one group: one scale per column
            g = k0 // GROUP_SIZE
            scale = tl.load(Scales + offs_n * ssn + g, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(Zeros + offs_n * szn + g, mask=offs_n < N, other=0).to(tl.float32)[None, :]
        else:
            g = offs_k[:, None] // GROUP_SIZE
            scale = tl.load(Scales + offs_n[None, :] * ssn + g, mask=w_ok, other=0.0).to(tl.float32)
            zero = tl.load(Zeros + offs_n[None, :] * szn + g, mask=w_ok, other=0).to(tl.float32)
        w = (q.to(tl.float32) - zero) * scale  # dequantized in registers, never stored
        acc += tl.dot(x, w.to(x.dtype))
    out_ptrs = Out + offs_m[:, None] * som + offs_n[None, :]
    out_ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc, mask=out_ok)
    else:
        tl.atomic_add(out_ptrs, acc, mask=out_ok)


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int | None = None) -> torch.Tensor:
    """y = x @ dequantize(qweight, scales, zeros)^T without materializing the weights:
    x [..., K], qweight uint8 [N, K // 2], scales [N, K // G], zeros uint8 [N, K // G] -> [..., N]."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if qweight.dtype != torch.uint8 or zeros.dtype != torch.uint8:
        raise ValueError("qweight and zeros must be uint8 (two 4-bit codes per qweight byte)")
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features but qweight packs {k} (K // 2 = {k // 2} bytes per row)")
    group_size = group_size or k // scales.shape[1]
    if k % group_size or scales.shape != (n, k // group_size) or zeros.shape != scales.shape:
        raise ValueError(f"scales and zeros must be [N={n}, K // G] with K={k} a multiple of G={group_size}")
    if group_size & (group_size - 1) or group_size < 16:
        raise ValueError(f"group size {group_size} must be a power of two >= 16")
    check_dtype(x)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m = x2.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32, device=x.device)  # fp32 partial sums (split-K adds into it)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
    _w4a16_kernel[grid](x2, qweight, scales, zeros, out, m, n, k, min(next_pow2(m), 256), x2.stride(0),
                        qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0), GROUP_SIZE=group_size)
    return out.to(x.dtype).reshape(*lead, n)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype=None) -> torch.Tensor:
    """The torch reference: unpack the nibbles and rescale, [N, K] in ``dtype`` (scales' by default)."""
    n = qweight.shape[0]
    q = torch.stack([qweight & 0xF, qweight >> 4], dim=-1).view(n, -1)  # low nibble first
    group = q.shape[1] // scales.shape[1]
    w = (q.float() - zeros.float().repeat_interleave(group, 1)) * scales.float().repeat_interleave(group, 1)
    return w.to(dtype or scales.dtype)


def quantize_int4(w: torch.Tensor, group_size: int = 128):
    """Round-to-nearest asymmetric INT4 per group (to make test inputs): qweight, scales, zeros."""
    n, k = w.shape
    g = w.float().view(n, k // group_size, group_size)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    zeros = (-lo / scales).round().clamp(0, 15)
    q = (g / scales[..., None] + zeros[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    qweight = q[:, 0::2] | (q[:, 1::2] << 4)
    return qweight.contiguous(), scales.half(), zeros.to(torch.uint8)


def w4a16_reference(x, qweight, scales, zeros):
    """Dequantize, then an ordinary matmul (the two-pass baseline)."""
    return (x.float() @ dequantize_int4(qweight, scales, zeros, torch.float32).T).to(x.dtype)


def check(device=None, dtype=None) -> float:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    worst = 0.0
    for m, n, k, g in [(1, 40, 96, 32), (5, 33, 128, 64), (17, 64, 256, 16)]:
        x = torch.randn(m, k, device=device, dtype=dtype)
        qw, s, z = quantize_int4(torch.randn(n, k, device=device), g)
        ref = w4a16_reference(x, qw, s, z).float()
        err = ((w4a16_matmul(x, qw, s, z).float() - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, err)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert worst < tol, f"w4a16_matmul differs from the reference by {worst:.3g} relative (tolerance {tol})"
    return worst


def bench(shapes=((1, 8192, 8192), (1, 28672, 8192), (1, 8192, 28672), (16, 28672, 8192), (4096, 8192, 8192)),
          group_size=128, dtype=torch.bfloat16, device="cuda") -> list[dict]:
    """Matrix-vector: GB/s of packed weights + scales read, and the fraction of HBM bandwidth.
    Baseline: dequantize to bf16, then torch's matmul (what runs without a fused kernel)."""
    rows = []
    for m, n, k in shapes:
        x = torch.randn(m, k, device=device, dtype=dtype)
        qw, s, z = quantize_int4(torch.randn(n, k, device=device), group_size)
        nbytes = qw.numel() + s.numel() * s.element_size() + z.numel() + x.numel() * x.element_size()
        baseline = lambda: x @ dequantize_int4(qw, s, z, dtype).T  # noqa: E731
        want = baseline().float()
        err = ((w4a16_matmul(x, qw, s, z).float() - want).abs().max() / want.abs().max()).item()
        ours = time_ms(lambda: w4a16_matmul(x, qw, s, z))
        base = time_ms(baseline)
        rows.append({"kernel": "w4a16_matmul", "shape": f"M{m} N{n} K{k} G{group_size}", "max_err": err,
                     "gbps": nbytes / ours / 1e6, "tflops": 2 * m * n * k / ours / 1e9,
                     "baseline_gbps": nbytes / base / 1e6, "ratio": base / ours})
    return rows
