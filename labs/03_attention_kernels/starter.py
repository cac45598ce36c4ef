"""Lab 03: attention kernels, in the style of the Triton puzzles. Write the three functions marked
TODO; the rest (kernels' loops, loads, launchers) is given. Everything runs on the CPU through
Triton's interpreter, so print() works inside kernels: use it.

1. online_softmax_attention (torch): attention of one query, one tile of keys at a time.
2. attention_tile (Triton): the same update on a tile of queries, the body of FlashAttention.
3. paged_rows (Triton, stretch): where a tile of token positions lives in a paged KV cache.

Grade your work with `inferlab grade labs/03_attention_kernels`. Keep the names and signatures.
"""
import math
import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # these kernels run on the CPU, even on a GPU machine
import inferlab.kernels  # noqa: F401  (must come before triton: it selects the CPU interpreter)
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # exp(x) == exp2(x * LOG2E)


# ---------------------------------------------------------------- puzzle 1: online softmax, in torch

def online_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """softmax(k @ q / sqrt(D)) @ v for one query q [D] over keys and values k, v [T, D].

    Visit k and v ``block_n`` rows at a time and keep only three running values: the largest
    score so far ``m``, the sum of exp(score - m) so far ``l``, and the weighted sum of value
    rows so far ``acc`` [D]. When a tile raises the maximum, multiply ``l`` and ``acc`` by
    exp(m_old - m_new) before adding the tile's share. Return acc / l.
    Never call softmax on all T scores at once (the tests give scores around 1000: exp overflows).
    """
    # TODO: puzzle 1
    raise NotImplementedError("about 10 lines")


# ---------------------------------------------------------------- puzzle 2: the FlashAttention tile

@triton.jit
def attention_tile(acc, l_i, m_i, q, k, v, keep, qk_scale):
    """One tile of the online softmax, for BLOCK_M queries at once. Returns (acc, l_i, m_i).

    acc [BLOCK_M, D] float32, l_i [BLOCK_M], m_i [BLOCK_M]: the running state (m_i starts at -inf).
    q [BLOCK_M, D]; k [D, BLOCK_N] (already transposed); v [BLOCK_N, D].
    keep [BLOCK_M, BLOCK_N]: True where a query may see a key (False: past the end, or causal).
    qk_scale: 1/sqrt(D) * LOG2E, so that exp2(score * qk_scale) == exp(score / sqrt(D)).
    Useful: tl.dot, tl.where, tl.max(x, 1), tl.sum(x, 1), tl.maximum, tl.math.exp2, x[:, None].
    """
    # TODO: puzzle 2
    raise NotImplementedError("about 8 lines")


@triton.jit
def _flash_attention_kernel(Q, K, V, Out, qk_scale, Hq, GROUP, Tq, Tk,
                            CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Given. One program per (tile of BLOCK_M queries, batch * query head); contiguous tensors."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    kv = b * (Hq // GROUP) + h // GROUP  # the K/V head this query head reads (GQA)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (bh * Tq + rows[:, None]) * HEAD_DIM + dims[None, :], mask=rows[:, None] < Tq, other=0.0)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    shift = Tk - Tq  # causal, bottom-right: query row i is key position i + shift
    hi = Tk
    if CAUSAL:
        hi = tl.minimum(Tk, (start_m + 1) * BLOCK_M + shift)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + (kv * Tk + cols[None, :]) * HEAD_DIM + dims[:, None], mask=cols[None, :] < Tk, other=0.0)
        v = tl.load(V + (kv * Tk + cols[:, None]) * HEAD_DIM + dims[None, :], mask=cols[:, None] < Tk, other=0.0)
        keep = (cols[None, :] < Tk) & (rows[:, None] >= 0)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + shift)
        acc, l_i, m_i = attention_tile(acc, l_i, m_i, q, k, v, keep, qk_scale)
    tl.store(Out + (bh * Tq + rows[:, None]) * HEAD_DIM + dims[None, :], acc / l_i[:, None], mask=rows[:, None] < Tq)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Given. q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D] float32 -> [B, Hq, Tq, D]."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    grid = (triton.cdiv(tq, 16), b * hq)
    _flash_attention_kernel[grid](q, k, v, out, LOG2E / math.sqrt(d), hq, hq // hkv, tq, tk,
                                  CAUSAL=causal, HEAD_DIM=d, BLOCK_M=16, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- puzzle 3 (stretch): paged K/V

@triton.jit
def paged_rows(BlockTables, b, max_blocks, pos, block_size, live):
    """Rows of the flattened cache [num_blocks * block_size, Hkv, D] that hold token positions
    ``pos`` [BLOCK_N] of sequence ``b``.

    BlockTables is [B, max_blocks] int32, contiguous: position p lives in physical block
    BlockTables[b, p // block_size], at row p % block_size of that block. Load the table
    entries only where ``live`` is True (past the sequence's end the table holds -1): use
    tl.load(pointers, mask=live, other=0). Return the rows as a [BLOCK_N] tensor.
    """
    # TODO: puzzle 3
    raise NotImplementedError("about 3 lines")


@triton.jit
def _paged_attention_kernel(Q, KCache, VCache, BlockTables, SeqLens, Out, qk_scale, Hkv, GROUP,
                            max_blocks, block_size, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """Given. One program per (sequence, K/V head): its GROUP query heads form the tile of queries."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, HEAD_DIM)
    heads = hk * GROUP + g
    q = tl.load(Q + (b * Hkv * GROUP + heads[:, None]) * HEAD_DIM + dims[None, :], mask=g[:, None] < GROUP, other=0.0)
    seq_len = tl.load(SeqLens + b)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        pos = start_n + tl.arange(0, BLOCK_N)
        live = pos < seq_len
        rows = paged_rows(BlockTables, b, max_blocks, pos, block_size, live).to(tl.int64)
        k = tl.load(KCache + (rows[None, :] * Hkv + hk) * HEAD_DIM + dims[:, None], mask=live[None, :], other=0.0)
        v = tl.load(VCache + (rows[:, None] * Hkv + hk) * HEAD_DIM + dims[None, :], mask=live[:, None], other=0.0)
        keep = live[None, :] & (g[:, None] >= 0)
        acc, l_i, m_i = attention_tile(acc, l_i, m_i, q, k, v, keep, qk_scale)
    tl.store(Out + (b * Hkv * GROUP + heads[:, None]) * HEAD_DIM + dims[None, :], acc / l_i[:, None],
             mask=g[:, None] < GROUP)


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens):
    """Given. q [B, Hq, D], caches [num_blocks, block_size, Hkv, D], block_tables [B, max_blocks]
    int32, seq_lens [B] int32 (each >= 1) -> [B, Hq, D]."""
    b, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    out = torch.empty_like(q)
    tables = block_tables.to(torch.int32).contiguous()
    _paged_attention_kernel[(b, hkv)](q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), tables,
                                      seq_lens.to(torch.int32), out, LOG2E / math.sqrt(d), hkv, hq // hkv,
                                      tables.shape[1], block_size, HEAD_DIM=d,
                                      BLOCK_G=max(16, triton.next_power_of_2(hq // hkv)), BLOCK_N=16)
    return out
