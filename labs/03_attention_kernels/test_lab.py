"""Graded tests for lab 03. `inferlab grade labs/03_attention_kernels` runs them against starter.py;
with --reference against inferlab.kernels (flash_attention, paged_attention), the reference solution.
Each answer is compared with plain torch (softmax over every score, or torch's own SDPA)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # graded on the CPU everywhere, GPU or not (before triton is imported)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from inferlab import labkit  # noqa: E402

lab = labkit.implementation(__file__, reference="inferlab.kernels.flash_attention",
                            functions=["online_softmax_attention", "flash_attention"])
paged = labkit.implementation(__file__, reference="inferlab.kernels.paged_attention", functions=["paged_attention"])


def call(fn, *args, **kwargs):
    """Run a lab function; an error inside a Triton kernel is reported as itself, not wrapped."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        cause = exc
        while type(cause).__name__ == "InterpreterError" and cause.__cause__ is not None:
            cause = cause.__cause__
        if cause is exc:
            raise
        raise cause from None


def expect_close(name, got, want, tol=1e-4, **inputs):
    labkit.expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
                  f"{name} must return a tensor of shape {tuple(want.shape)}",
                  got=tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__, **inputs)
    labkit.expect(bool(torch.isfinite(got).all()), f"{name} returned inf or nan (did exp overflow?)", **inputs)
    err = (got.float() - want.float()).abs().max().item()
    labkit.expect(err < tol, f"{name} differs from torch by {err:.3g} at most (tolerance {tol:g})", **inputs)


def sdpa(q, k, v, causal):
    tq, tk = q.shape[2], k.shape[2]
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def one_query(t, d, scale, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(d, generator=g) * scale, torch.randn(t, d, generator=g) * scale, torch.randn(t, d, generator=g)
    return q, k, v, torch.softmax(k @ q / d**0.5, 0) @ v


# ---------------------------------------------------------------- puzzle 1

@labkit.points(2)
def test_online_softmax_matches_softmax():
    q, k, v, want = one_query(37, 16, 1.0, 0)
    expect_close("online_softmax_attention", call(lab.online_softmax_attention, q, k, v, 8), want, T=37, block_n=8)


@labkit.points(1)
def test_online_softmax_survives_large_scores():
    q, k, v, want = one_query(50, 16, 30.0, 1)  # scores in the thousands: exp() alone overflows
    expect_close("online_softmax_attention", call(lab.online_softmax_attention, q, k, v, 16), want, T=50, block_n=16)


@labkit.points(1)
@settings(max_examples=25)
@given(st.integers(1, 60), st.integers(1, 20), st.integers(0, 10**6))
def test_online_softmax_any_length_and_tile(t, block_n, seed):
    q, k, v, want = one_query(t, 8, 3.0, seed)
    expect_close("online_softmax_attention", call(lab.online_softmax_attention, q, k, v, block_n), want,
                 T=t, block_n=block_n)


# ---------------------------------------------------------------- puzzle 2

def qkv(b, hq, hkv, tq, tk, d, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, tq, d, generator=g) * scale, torch.randn(b, hkv, tk, d, generator=g) * scale,
            torch.randn(b, hkv, tk, d, generator=g))


@labkit.points(2)
def test_flash_attention_without_mask():
    q, k, v = qkv(1, 2, 2, 40, 40, 16)
    expect_close("flash_attention", call(lab.flash_attention, q, k, v, causal=False), sdpa(q, k, v, False),
                 shape="B1 H2 T40 D16", causal=False)


@labkit.points(2)
def test_flash_attention_causal_and_ragged():
    q, k, v = qkv(2, 2, 2, 21, 45, 32, seed=1)  # the queries are the last 21 of 45 positions
    expect_close("flash_attention", call(lab.flash_attention, q, k, v, causal=True), sdpa(q, k, v, True),
                 shape="B2 H2 Tq21 Tk45 D32", causal=True)


@labkit.points(1)
def test_flash_attention_gqa():
    q, k, v = qkv(1, 4, 1, 37, 37, 16, scale=3.0, seed=2)  # four query heads share one K/V head
    expect_close("flash_attention", call(lab.flash_attention, q, k, v, causal=True), sdpa(q, k, v, True),
                 shape="B1 Hq4 Hkv1 T37 D16", causal=True)


@labkit.points(1)
def test_flash_attention_large_scores():
    q, k, v = qkv(1, 1, 1, 33, 33, 16, scale=30.0, seed=3)
    expect_close("flash_attention", call(lab.flash_attention, q, k, v, causal=True), sdpa(q, k, v, True),
                 tol=1e-3, shape="B1 H1 T33 D16", scores="about 1000")


# ---------------------------------------------------------------- puzzle 3 (stretch)

def paged_case(block_size, hq, hkv, d, tables, lens, seed):
    g = torch.Generator().manual_seed(seed)
    num_blocks = max(max(t) for t in tables) + 2
    q = torch.randn(len(lens), hq, d, generator=g)
    k_cache, v_cache = (torch.randn(num_blocks, block_size, hkv, d, generator=g) for _ in range(2))
    tables, lens = torch.tensor(tables, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    want = torch.zeros(q.shape)
    for b, n in enumerate(lens.tolist()):  # gather each sequence's K/V through its table, then SDPA
        pos = torch.arange(n)
        blocks = tables[b].long()[pos // block_size]
        k, v = (c[blocks, pos % block_size].transpose(0, 1)[None] for c in (k_cache, v_cache))
        want[b] = sdpa(q[b, :, None][None], k, v, False)[0, :, 0]
    return (q, k_cache, v_cache, tables, lens), want


@labkit.points(2)
def test_paged_attention_with_holes_and_shared_blocks():
    # sequence 0 and 2 share block 5 (a common prompt); -1 marks table entries past the end
    args, want = paged_case(8, 4, 2, 16, [[5, 1, 3, -1], [0, 7, 2, 4], [5, 6, -1, -1]], [20, 29, 9], seed=4)
    expect_close("paged_attention", call(paged.paged_attention, *args), want,
                 block_size=8, seq_lens=[20, 29, 9])


@labkit.points(1)
def test_paged_attention_small_blocks_mqa():
    args, want = paged_case(3, 4, 1, 32, [[9, 2, 7, 0, 4, 11, 1]], [19], seed=5)  # a tile spans many blocks
    expect_close("paged_attention", call(paged.paged_attention, *args), want, block_size=3, seq_lens=[19])
