"""Flash-Decoding in Triton: one query per sequence, the keys split across programs.

In decode each sequence brings a single query, so FlashAttention's parallelism (one program per
tile of queries) collapses to one program per (sequence, head): a few dozen programs on a GPU with
over a hundred multiprocessors, each walking the whole cache alone. Flash-Decoding (Dao, Haziza,
Massa, Sizov, 2023) splits the keys into ``num_splits`` chunks, lets each chunk's program compute
a partial softmax (its output, normalized, and its log-sum-exp), then a second small kernel merges
the partials: out = sum_s w_s out_s with w_s = exp(lse_s - lse), lse = log sum_s exp(lse_s).

Each program serves all the query heads that share one K/V head (GQA), so every cached K/V row is
read once per group, not once per query head.
Layout: q [B, Hq, D], k/v [B, Hkv, Tmax, D], seq_lens [B] (keys at positions >= seq_lens[b] are
ignored). A sequence of length 0 gets zeros.
"""
from __future__ import annotations

import math

import torch

import inferlab.kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from inferlab.kernels import INTERPRETED
from inferlab.kernels._util import check_dtype, check_head_dim, next_pow2, sdpa_flash, time_ms

LOG2E = 1.4426950408889634
BLOCK_N = 32 if INTERPRETED else 64


@triton.jit
def _decode_split_kernel(Q, K, V, SeqLens, PartOut, PartLse, qk_scale,
                         sqb, sqh, skb, skh, skt, svb, svh, svt, Hkv, GROUP, split_size,
                         HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                         NUM_SPLITS: tl.constexpr):
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // Hkv
    hk = bk % Hkv
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = hk * GROUP + offs_g  # the query heads of this K/V head's group
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + offs_d[None, :], mask=offs_g[:, None] < GROUP, other=0.0)
    seq_len = tl.load(SeqLens + b)
    start = split * split_size
    end = tl.minimum(start + split_size, seq_len)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + b * skb + hk * skh + cols[None, :] * skt + offs_d[:, None], mask=cols[None, :] < end, other=0.0)
        s = tl.dot(q, k) * qk_scale
        s = tl.where(cols[None, :] < end, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svt + offs_d[None, :], mask=cols[:, None] < end, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    store_partials(PartOut, PartLse, acc, l_i, m_i, b * Hkv * GROUP + heads, split, offs_g < GROUP,
                   offs_d, HEAD_DIM, NUM_SPLITS)


@triton.jit
def store_partials(PartOut, PartLse, acc, l_i, m_i, rows, split, row_ok, offs_d,
                   HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Write one split's normalized output and log2-sum-exp for each (sequence, head) row.
    An empty split (no key in range) writes lse = -inf, which gives it weight 0 in the merge."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    tl.store(PartOut + (rows[:, None] * NUM_SPLITS + split) * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
    tl.store(PartLse + rows * NUM_SPLITS + split, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(PartOut, PartLse, Out, rows, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr):
    """Second pass: merge the partials of BLOCK_R (sequence, query head) rows, weighted by exp(lse)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (r[:, None] < rows) & (offs_s[None, :] < NUM_SPLITS)  # [BLOCK_R, BLOCK_S]
    lse = tl.load(PartLse + r[:, None] * NUM_SPLITS + offs_s[None, :], mask=ok, other=float("-inf"))
    m = tl.max(lse, 1)
    w = tl.math.exp2(lse - tl.where(m == float("-inf"), 0.0, m)[:, None])  # empty splits weigh 0
    part = tl.load(PartOut + ((r[:, None] * NUM_SPLITS + offs_s[None, :]) * HEAD_DIM)[:, :, None] + offs_d[None, None, :],
                   mask=ok[:, :, None], other=0.0)  # [BLOCK_R, BLOCK_S, HEAD_DIM]
    total = tl.sum(w, 1)
    out = tl.sum(part * w[:, :, None], 1) / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(Out + r[:, None] * HEAD_DIM + offs_d[None, :], out.to(Out.dtype.element_ty), mask=r[:, None] < rows)


def default_num_splits(batch: int, kv_heads: int, max_len: int, device) -> int:
    """Enough programs to fill the GPU (two per multiprocessor), never chunks under 256 keys; on
    the CPU (the interpreter runs programs one after another) a single split."""
    if torch.device(device).type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(triton.cdiv(2 * sms, batch * kv_heads), triton.cdiv(max_len, 256)))
    return 1


def split_size_for(max_len: int, num_splits: int) -> int:
    return triton.cdiv(triton.cdiv(max_len, num_splits), BLOCK_N) * BLOCK_N


def merge_splits(part_out, part_lse, out):
    """Merge [rows, num_splits, D] partials into ``out`` (rows = B * Hq). One split needs no merge.
    The interpreter pays per program, so there one program merges every row."""
    rows, num_splits, d = part_out.shape
    if num_splits == 1:
        return out.copy_(part_out.view(out.shape))
    block_r = min(64, next_pow2(rows)) if INTERPRETED else 4
    _merge_splits_kernel[(triton.cdiv(rows, block_r),)](part_out, part_lse, out, rows, NUM_SPLITS=num_splits,
                                                        BLOCK_S=max(2, next_pow2(num_splits)), HEAD_DIM=d, BLOCK_R=block_r)
    return out


def flash_decoding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                   num_splits: int | None = None, sm_scale: float | None = None) -> torch.Tensor:
    """Attention of one query per sequence over its first seq_lens[b] keys: q [B, Hq, D],
    k/v [B, Hkv, Tmax, D], seq_lens [B] -> [B, Hq, D]."""
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError("flash_decoding wants q [B, Hq, D] and k, v [B, Hkv, Tmax, D] of one shape")
    b, hq, d = q.shape
    hkv, tmax = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d or hq % hkv:
        raise ValueError(f"k {tuple(k.shape)} does not fit q {tuple(q.shape)}: want [B, Hkv, Tmax, D], Hq % Hkv == 0")
    if seq_lens.shape != (b,):
        raise ValueError(f"seq_lens must have shape [{b}], got {tuple(seq_lens.shape)}")
    check_head_dim(d)
    check_dtype(q, k, v)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32)
    num_splits = num_splits or default_num_splits(b, hkv, tmax, q.device)
    group = hq // hkv
    part_out = torch.empty(b * hq, num_splits, d, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b * hq, num_splits, dtype=torch.float32, device=q.device)
    scale = (1.0 / math.sqrt(d) if sm_scale is None else sm_scale) * LOG2E
    _decode_split_kernel[(b * hkv, num_splits)](
        q, k, v, seq_lens, part_out, part_lse, scale, q.stride(0), q.stride(1), *k.stride()[:3],
        *v.stride()[:3], hkv, group, split_size_for(tmax, num_splits), HEAD_DIM=d,
        BLOCK_G=max(16, next_pow2(group)), BLOCK_N=BLOCK_N, NUM_SPLITS=num_splits)
    return merge_splits(part_out, part_lse, torch.empty(b, hq, d, dtype=q.dtype, device=q.device))


def split_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int) -> dict:
    """What the two kernels compute, for one query q [D] over k/v [T, D], in torch: each split's
    key range, its log-sum-exp and normalized output, its weight in the merge, and the result."""
    d, t = q.shape[-1], k.shape[0]
    size = -(-t // num_splits)
    parts = []
    for start in range(0, t, size):
        s = (k[start:start + size].float() @ q.float()) * d**-0.5
        parts.append({"start": start, "stop": min(start + size, t), "lse": torch.logsumexp(s, 0).item(),
                      "out": s.softmax(0) @ v[start:start + size].float()})
    lse = torch.logsumexp(torch.tensor([p["lse"] for p in parts]), 0).item()
    for p in parts:
        p["weight"] = math.exp(p["lse"] - lse)
    return {"splits": parts, "lse": lse, "out": sum(p["weight"] * p["out"] for p in parts)}


def decoding_reference(q, k, v, seq_lens, sm_scale=None):
    """Plain torch: each sequence's query against its first seq_lens[b] keys."""
    b, hq, d = q.shape
    k = k.repeat_interleave(hq // k.shape[1], dim=1).float()
    v = v.repeat_interleave(hq // v.shape[1], dim=1).float()
    scores = torch.einsum("bhd,bhtd->bht", q.float(), k) * (d**-0.5 if sm_scale is None else sm_scale)
    seen = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens.to(q.device)[:, None]
    scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
    out = torch.einsum("bht,bhtd->bhd", scores.softmax(-1).nan_to_num(0.0), v)
    return out.to(q.dtype)


def check(device=None, dtype=None) -> float:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    worst = 0.0
    for hq, hkv, tmax, d, lens, splits in [(4, 1, 70, 32, [1, 70, 33], 3), (8, 2, 100, 128, [99, 5], None)]:
        q = torch.randn(len(lens), hq, d, device=device, dtype=dtype)
        k, v = (torch.randn(len(lens), hkv, tmax, d, device=device, dtype=dtype) for _ in range(2))
        lens = torch.tensor(lens, device=device)
        err = (flash_decoding(q, k, v, lens, splits).float() - decoding_reference(q, k, v, lens).float()).abs().max()
        worst = max(worst, err.item())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert worst < tol, f"flash_decoding differs from the reference by {worst:.3g} (tolerance {tol})"
    return worst


def bench(seq_lens=(1024, 4096, 8192), batch=8, heads=32, kv_heads=8, head_dim=128,
          dtype=torch.bfloat16, device="cuda") -> list[dict]:
    """GB/s of K/V read: the kernel vs SDPA's flash backend on the same single-query batch."""
    rows = []
    for t in seq_lens:
        q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
        k, v = (torch.randn(batch, kv_heads, t, head_dim, device=device, dtype=dtype) for _ in range(2))
        lens = torch.full((batch,), t, device=device, dtype=torch.int32)
        nbytes = 2 * k.numel() * k.element_size()
        baseline = sdpa_flash(q[:, :, None], k, v)
        err = (flash_decoding(q, k, v, lens).float() - baseline()[:, :, 0].float()).abs().max().item()
        ours = time_ms(lambda: flash_decoding(q, k, v, lens))
        base = time_ms(baseline)
        rows.append({"kernel": "flash_decoding", "shape": f"B{batch} H{heads}/{kv_heads} T{t} D{head_dim}", "max_err": err,
                     "gbps": nbytes / ours / 1e6, "baseline_gbps": nbytes / base / 1e6, "ratio": base / ours})
    return rows
