"""FlashAttention forward in Triton: exact attention without the N x N score matrix.

Standard attention writes S = Q K^T (Tq x Tk numbers per head) to memory, reads it back for the
softmax, writes P, reads it again for P V. FlashAttention (Dao et al., 2022; FlashAttention-2, Dao
2023) keeps one tile of Q in on-chip memory, streams K and V past it tile by tile, and keeps a
*running* softmax: per query row the largest score so far ``m`` and the sum of exponentials ``l``.
When a new tile raises the maximum, what was accumulated is rescaled by exp(m_old - m_new). Memory
traffic drops from O(Tq Tk) to O(Tq D + Tk D) per head, and the result is exact.

Layout: q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D], Hq a multiple of Hkv (GQA/MQA: query head h reads
K/V head h // (Hq // Hkv)). ``causal`` aligns the queries to the last Tq keys (bottom-right, as
FlashAttention-2): query i sees keys j <= i + Tk - Tq.
"""
from __future__ import annotations

import math

import torch

import inferlab.kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from inferlab.kernels._util import check_dtype, check_head_dim, maybe_autotune, next_pow2, sdpa_flash, time_ms

LOG2E = 1.4426950408889634


@triton.jit
def _attn_tile(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, start_n, offs_m, offs_d,
               Tk, shift, qk_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """One K/V tile: scores, the online-softmax update, and the rescaled accumulator."""
    cols = start_n + tl.arange(0, BLOCK_N)
    k_ptrs = k_base + cols[None, :] * stride_kt + offs_d[:, None]
    v_ptrs = v_base + cols[:, None] * stride_vt + offs_d[None, :]
    if MASKED:  # only tiles that cross the end of K or the causal diagonal pay for masks
        k = tl.load(k_ptrs, mask=cols[None, :] < Tk, other=0.0)
        v = tl.load(v_ptrs, mask=cols[:, None] < Tk, other=0.0)
        s = tl.dot(q, k) * qk_scale  # [BLOCK_M, BLOCK_N], in log2 units (exp2 is the fast exponential)
        keep = cols[None, :] < Tk
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(keep, s, float("-inf"))
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
        s = tl.dot(q, k) * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))  # the running maximum of each row
    alpha = tl.math.exp2(m_i - m_new)  # how much the old maximum overestimated: rescale by this
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in [(32, 32, 4, 1), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                 (128, 32, 4, 4), (64, 128, 4, 3)]]


@maybe_autotune(_CONFIGS, key=["HEAD_DIM", "CAUSAL", "TK_BUCKET", "TQ_BUCKET"])
@triton.jit
def _flash_attention_kernel(Q, K, V, Out, qk_scale,
                            sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                            Hq, GROUP, Tq, Tk, TK_BUCKET, TQ_BUCKET,
                            HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    hk = h // GROUP  # GQA: GROUP query heads share one K/V head
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=offs_m[:, None] < Tq, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    shift = Tk - Tq  # bottom-right: query row i is key position i + shift
    if CAUSAL:
        hi = tl.minimum(Tk, (start_m + 1) * BLOCK_M + shift)  # later keys are hidden from every row
        lo = tl.maximum(0, start_m * BLOCK_M + shift + 1) // BLOCK_N * BLOCK_N  # tiles every row sees
    else:
        hi = Tk
        lo = Tk // BLOCK_N * BLOCK_N  # full tiles need no mask
    for start_n in range(0, lo, BLOCK_N):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, k_base, v_base, skt, svt, start_n, offs_m, offs_d,
                                   Tk, shift, qk_scale, BLOCK_N, False, CAUSAL)
    for start_n in range(lo, hi, BLOCK_N):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, k_base, v_base, skt, svt, start_n, offs_m, offs_d,
                                   Tk, shift, qk_scale, BLOCK_N, True, CAUSAL)
    acc = acc / l_i[:, None]
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < Tq)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v, tiled: q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D] -> [B, Hq, Tq, D]."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("flash_attention wants q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D]")
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [B={b}, Hkv, Tk, D={d}]")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if causal and tq > tk:
        raise ValueError(f"causal attention needs Tq <= Tk (queries are the last Tq keys), got {tq} > {tk}")
    check_head_dim(d)
    check_dtype(q, k, v)
    if tk == 0 or tq == 0:
        raise ValueError("flash_attention needs at least one query and one key")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(b, hq, tq, d, dtype=q.dtype, device=q.device)
    scale = (1.0 / math.sqrt(d) if sm_scale is None else sm_scale) * LOG2E
    grid = lambda meta: (triton.cdiv(tq, meta["BLOCK_M"]), b * hq)  # noqa: E731
    _flash_attention_kernel[grid](q, k, v, out, scale, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                                  *out.stride()[:3], hq, hq // hkv, tq, tk, next_pow2(tk), next_pow2(tq),
                                  HEAD_DIM=d, CAUSAL=causal)
    return out


def attention_reference(q, k, v, causal=True, sm_scale=None):
    """The plain torch computation, materializing every score: the answer the kernel must match."""
    d, hq, hkv = q.shape[-1], q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1).float()
    v = v.repeat_interleave(hq // hkv, dim=1).float()
    scores = (q.float() @ k.transpose(-1, -2)) * (d**-0.5 if sm_scale is None else sm_scale)
    if causal:
        tq, tk = q.shape[2], k.shape[2]
        seen = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        scores = scores.masked_fill(~seen, float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


def hbm_bytes(seq_len: int, head_dim: int = 128, heads: int = 32, dtype_bytes: int = 2,
              block_m: int = 128) -> dict:
    """Bytes moved to and from GPU memory by one layer's attention (one sequence, all heads).

    naive: S = Q K^T written and read back, P = softmax(S) written and read back: 4 T^2 numbers
    per head on top of reading Q, K, V and writing O (4 T D).
    tiled: Q read once, O written once, K and V read once per tile of ``block_m`` queries
    (every tile streams the whole of K and V: no reuse through caches assumed), 2 T D + 2 T D
    ceil(T / block_m). The score matrix itself never leaves the chip.
    scores: the memory the naive version needs to hold S for one head.
    """
    t, d = seq_len, head_dim
    naive = heads * (4 * t * d + 4 * t * t) * dtype_bytes
    tiled = heads * (2 * t * d + 2 * t * d * -(-t // block_m)) * dtype_bytes
    return {"naive": naive, "tiled": tiled, "ratio": naive / tiled, "scores": t * t * dtype_bytes}


def online_softmax_trace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int = 16) -> list[dict]:
    """The kernel's inner loop for one query, in torch, recording the state after every tile.

    q [D], k/v [T, D]. Each entry: the tile's key range, the running max ``m``, the running sum of
    exponentials ``l``, the factor ``alpha = exp(m_old - m_new)`` that rescaled what came before,
    and the output so far ``acc / l`` (the exact answer once the last tile is in).
    """
    d = q.shape[-1]
    m = torch.tensor(float("-inf"), dtype=torch.float32)
    l = torch.tensor(0.0)
    acc = torch.zeros(d)
    steps = []
    for start in range(0, k.shape[0], block_n):
        s = (k[start:start + block_n].float() @ q.float()) * d**-0.5  # this tile's scores
        m_new = torch.maximum(m, s.max())
        alpha = torch.exp(m - m_new)  # 0 on the first tile (m = -inf)
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum()
        acc = acc * alpha + p @ v[start:start + block_n].float()
        m = m_new
        steps.append({"start": start, "stop": start + len(s), "scores": s, "m": m.item(), "l": l.item(),
                      "alpha": alpha.item(), "out": acc / l})
    return steps


def online_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """softmax(k q / sqrt(D)) @ v for one query q [D] over k/v [T, D], one tile of block_n keys
    at a time, never holding more than one tile's scores (the algorithm of the kernel, in torch)."""
    return online_softmax_trace(q, k, v, block_n)[-1]["out"].to(q.dtype)


def check(device=None, dtype=None) -> float:
    """Compare with the reference on odd shapes (GQA, causal, ragged tiles); returns the max error."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    worst = 0.0
    for b, hq, hkv, tq, tk, d, causal in [(1, 4, 1, 1, 37, 16, True), (2, 4, 2, 19, 19, 32, True),
                                          (1, 2, 2, 13, 50, 64, False), (1, 8, 2, 40, 70, 128, True)]:
        q = torch.randn(b, hq, tq, d, device=device, dtype=dtype)
        k, v = (torch.randn(b, hkv, tk, d, device=device, dtype=dtype) for _ in range(2))
        err = (flash_attention(q, k, v, causal).float() - attention_reference(q, k, v, causal).float()).abs().max()
        worst = max(worst, err.item())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert worst < tol, f"flash_attention differs from the reference by {worst:.3g} (tolerance {tol})"
    return worst


def bench(seq_lens=(1024, 2048, 4096, 8192), batch=4, heads=32, kv_heads=8, head_dim=128,
          causal=True, dtype=torch.bfloat16, device="cuda") -> list[dict]:
    """TFLOP/s of the kernel and of SDPA's flash backend (same process, same inputs)."""
    rows = []
    for t in seq_lens:
        q = torch.randn(batch, heads, t, head_dim, device=device, dtype=dtype)
        k, v = (torch.randn(batch, kv_heads, t, head_dim, device=device, dtype=dtype) for _ in range(2))
        flops = 4 * batch * heads * t * t * head_dim * (0.5 if causal else 1.0)
        baseline = sdpa_flash(q, k, v, causal)
        err = (flash_attention(q, k, v, causal).float() - baseline().float()).abs().max().item()
        ours = time_ms(lambda: flash_attention(q, k, v, causal))
        base = time_ms(baseline)
        rows.append({"kernel": "flash_attention", "shape": f"B{batch} H{heads}/{kv_heads} T{t} D{head_dim}", "max_err": err,
                     "tflops": flops / ours / 1e9, "baseline_tflops": flops / base / 1e9, "ratio": base / ours})
    return rows
