"""Paged decode attention in Triton: Flash-Decoding over a block table (PagedAttention).

A paged KV cache (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023) stores K and V in fixed-size blocks, ``[num_blocks, block_size, Hkv,
D]`` per layer, and gives each sequence a *block table*: logical block i of the sequence lives in
physical block ``block_tables[b, i]``. Token position p sits at row ``p % block_size`` of block
``block_tables[b, p // block_size]``. Blocks need not be contiguous, in order, or private: two
sequences sharing a prompt point at the same blocks.

The kernel is :mod:`flash_decoding`'s with one change: each tile of BLOCK_N positions first looks
up its blocks in the table, then gathers the K/V rows from wherever they live. The partials are
merged by the same second kernel.
"""
from __future__ import annotations

import math

import torch

import inferlab.kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from inferlab.kernels._util import check_dtype, check_head_dim, next_pow2, sdpa_flash, time_ms
from inferlab.kernels.flash_decoding import (BLOCK_N, LOG2E, default_num_splits, merge_splits,
                                             split_size_for, store_partials)


@triton.jit
def _paged_split_kernel(Q, KCache, VCache, BlockTables, SeqLens, PartOut, PartLse, qk_scale,
                        sqb, sqh, skn, sks, skh, svn, svs, svh, sbt, Hkv, GROUP, block_size, split_size,
                        HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                        NUM_SPLITS: tl.constexpr):
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // Hkv
    hk = bk % Hkv
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = hk * GROUP + offs_g
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + offs_d[None, :], mask=offs_g[:, None] < GROUP, other=0.0)
    seq_len = tl.load(SeqLens + b)
    start = split * split_size
    end = tl.minimum(start + split_size, seq_len)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        pos = start_n + tl.arange(0, BLOCK_N)
        live = pos < end
        block = tl.load(BlockTables + b * sbt + pos // block_size, mask=live, other=0).to(tl.int64)
        row = pos % block_size
        k = tl.load(KCache + block[None, :] * skn + row[None, :] * sks + hk * skh + offs_d[:, None],
                    mask=live[None, :], other=0.0)
        s = tl.dot(q, k) * qk_scale
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VCache + block[:, None] * svn + row[:, None] * svs + hk * svh + offs_d[None, :],
                    mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    store_partials(PartOut, PartLse, acc, l_i, m_i, b * Hkv * GROUP + heads, split, offs_g < GROUP,
                   offs_d, HEAD_DIM, NUM_SPLITS)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float | None = None,
                    num_splits: int | None = None) -> torch.Tensor:
    """One query per sequence against its paged K/V: q [B, Hq, D], caches [num_blocks,
    block_size, Hkv, D], block_tables [B, max_blocks] int32, seq_lens [B] int32 -> [B, Hq, D]."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("paged_attention wants q [B, Hq, D] and k_cache, v_cache [num_blocks, block_size, Hkv, D]")
    b, hq, d = q.shape
    _, block_size, hkv, dk = k_cache.shape
    if dk != d or hq % hkv:
        raise ValueError(f"cache {tuple(k_cache.shape)} does not fit q {tuple(q.shape)}: want D={d}, Hq % Hkv == 0")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError(f"block_tables must be [B={b}, max_blocks] and seq_lens [{b}]")
    check_head_dim(d)
    check_dtype(q, k_cache, v_cache)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache need a contiguous last dimension")
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32)
    max_len = block_tables.shape[1] * block_size  # a bound known without reading seq_lens back
    num_splits = num_splits or default_num_splits(b, hkv, max_len, q.device)
    group = hq // hkv
    part_out = torch.empty(b * hq, num_splits, d, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b * hq, num_splits, dtype=torch.float32, device=q.device)
    scale = (1.0 / math.sqrt(d) if sm_scale is None else sm_scale) * LOG2E
    _paged_split_kernel[(b * hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse, scale, q.stride(0), q.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0), hkv, group, block_size,
        split_size_for(max_len, num_splits), HEAD_DIM=d, BLOCK_G=max(16, next_pow2(group)),
        BLOCK_N=BLOCK_N, NUM_SPLITS=num_splits)
    return merge_splits(part_out, part_lse, torch.empty(b, hq, d, dtype=q.dtype, device=q.device))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, seq_len: int, b: int) -> torch.Tensor:
    """Sequence b's first seq_len rows, [Hkv, seq_len, D], read through its block table."""
    block_size = cache.shape[1]
    pos = torch.arange(seq_len, device=cache.device)
    blocks = block_tables[b].long()[pos // block_size]
    return cache[blocks, pos % block_size].transpose(0, 1)


def paged_reference(q, k_cache, v_cache, block_tables, seq_lens, sm_scale=None):
    """Plain torch: gather each sequence's K/V through its table, then ordinary attention."""
    b, hq, d = q.shape
    out = torch.zeros(b, hq, d, dtype=torch.float32, device=q.device)
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        k = gather_kv(k_cache, block_tables, n, i).float().repeat_interleave(hq // k_cache.shape[2], 0)
        v = gather_kv(v_cache, block_tables, n, i).float().repeat_interleave(hq // k_cache.shape[2], 0)
        scores = torch.einsum("hd,htd->ht", q[i].float(), k) * (d**-0.5 if sm_scale is None else sm_scale)
        out[i] = torch.einsum("ht,htd->hd", scores.softmax(-1), v)
    return out.to(q.dtype)


def check(device=None, dtype=None) -> float:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    q = torch.randn(3, 8, 64, device=device, dtype=dtype)
    k_cache, v_cache = (torch.randn(12, 16, 2, 64, device=device, dtype=dtype) for _ in range(2))
    # holes (-1 past each sequence's end), blocks out of order, block 7 shared by sequences 0 and 2
    tables = torch.tensor([[7, 2, 9, -1], [0, 11, 3, 5], [7, 4, -1, -1]], device=device, dtype=torch.int32)
    lens = torch.tensor([40, 61, 17], device=device, dtype=torch.int32)
    ref = paged_reference(q, k_cache, v_cache, tables, lens).float()
    worst = max((paged_attention(q, k_cache, v_cache, tables, lens, num_splits=s).float() - ref).abs().max().item()
                for s in (None, 1, 3))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert worst < tol, f"paged_attention differs from the reference by {worst:.3g} (tolerance {tol})"
    return worst


def bench(seq_lens=(1024, 4096, 8192), batch=8, heads=32, kv_heads=8, head_dim=128, block_size=16,
          dtype=torch.bfloat16, device="cuda") -> list[dict]:
    """GB/s of K/V read through shuffled block tables, vs SDPA's flash backend on the same K/V
    stored contiguously (the baseline does no gather, so a ratio near 1 means paging is free)."""
    rows = []
    for t in seq_lens:
        nblk = t // block_size
        q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
        k_cache, v_cache = (torch.randn(batch * nblk, block_size, kv_heads, head_dim, device=device, dtype=dtype)
                            for _ in range(2))
        tables = torch.randperm(batch * nblk, device=device).view(batch, nblk).int()
        lens = torch.full((batch,), t, device=device, dtype=torch.int32)
        k, v = (c[tables.long()].view(batch, t, kv_heads, head_dim).transpose(1, 2).contiguous()
                for c in (k_cache, v_cache))
        nbytes = 2 * batch * t * kv_heads * head_dim * k_cache.element_size()
        baseline = sdpa_flash(q[:, :, None], k, v)
        err = (paged_attention(q, k_cache, v_cache, tables, lens).float() - baseline()[:, :, 0].float()).abs().max().item()
        ours = time_ms(lambda: paged_attention(q, k_cache, v_cache, tables, lens))
        base = time_ms(baseline)
        rows.append({"kernel": "paged_attention", "shape": f"B{batch} H{heads}/{kv_heads} T{t} D{head_dim} bs{block_size}",
                     "max_err": err,
                     "gbps": nbytes / ours / 1e6, "baseline_gbps": nbytes / base / 1e6, "ratio": base / ours})
    return rows
