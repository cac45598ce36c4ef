"""Flash-Decoding (split-KV) and paged decode against torch's SDPA on the same keys stored contiguously."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.kernels.flash_decoding import flash_decoding
from inferlab.kernels.paged_attention import paged_attention, paged_reference
from tests.kernels.conftest import DEVICE, tol


def sdpa_decode(q, k, v, seq_lens):
    """Each sequence alone through torch's SDPA over its first seq_lens[b] keys (zeros if none)."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        if n:
            out[b] = F.scaled_dot_product_attention(q[b, :, None].float(), k[b, :, :n].float(), v[b, :, :n].float(),
                                                    enable_gqa=q.shape[1] != k.shape[1])[:, 0]
    return out


def paged_copy(k, v, seq_lens, block_size, num_blocks, generator):
    """Scatter contiguous K/V [B, Hkv, T, D] into a paged cache through shuffled block tables
    (slot = block_table[p // block_size] * block_size + p % block_size); unused entries are -1."""
    b, hkv, t, d = k.shape
    per_seq = -(-t // block_size)
    perm = torch.randperm(num_blocks, generator=generator)[: b * per_seq].view(b, per_seq)
    tables = torch.full((b, per_seq + 2), -1, dtype=torch.int32)
    k_cache = torch.randn(num_blocks, block_size, hkv, d, dtype=k.dtype, generator=generator).to(DEVICE)
    v_cache = torch.randn_like(k_cache)
    for i, n in enumerate(seq_lens.tolist()):
        used = -(-n // block_size)
        tables[i, :used] = perm[i, :used]
        pos = torch.arange(n)
        slots = tables[i, pos // block_size].long() * block_size + pos % block_size
        k_cache.view(-1, hkv, d)[slots.to(DEVICE)] = k[i, :, :n].transpose(0, 1)
        v_cache.view(-1, hkv, d)[slots.to(DEVICE)] = v[i, :, :n].transpose(0, 1)
    return k_cache, v_cache, tables.to(DEVICE)


@pytest.mark.parametrize("hq,hkv,d,lens,splits", [
    (4, 1, 16, [1, 45, 20], None),   # MQA, length 1
    (8, 2, 32, [33, 7], 1),          # GQA 4:1, no split
    (4, 4, 64, [70, 64, 0], 3),      # a split past the end of a short sequence; an empty one
    (2, 2, 128, [5], 5),
])
def test_flash_decoding_matches_sdpa(hq, hkv, d, lens, splits, dtype):
    tmax = max(lens) + 3
    q = torch.randn(len(lens), hq, d, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(len(lens), hkv, tmax, d, device=DEVICE, dtype=dtype) for _ in range(2))
    lens = torch.tensor(lens, device=DEVICE)
    out = flash_decoding(q, k, v, lens, num_splits=splits)
    torch.testing.assert_close(out.float(), sdpa_decode(q, k, v, lens), atol=tol(dtype), rtol=tol(dtype))


def test_splits_change_nothing(dtype):
    q = torch.randn(2, 4, 32, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(2, 2, 100, 32, device=DEVICE, dtype=dtype) for _ in range(2))
    lens = torch.tensor([100, 61], device=DEVICE)
    one = flash_decoding(q, k, v, lens, num_splits=1).float()
    for s in (2, 4):
        torch.testing.assert_close(flash_decoding(q, k, v, lens, num_splits=s).float(), one,
                                   atol=tol(dtype), rtol=tol(dtype))


@pytest.mark.parametrize("block_size,hq,hkv,d,lens", [
    (16, 8, 2, 64, [40, 1, 17]),
    (4, 4, 1, 16, [13, 9]),      # blocks smaller than a tile: one tile gathers from many blocks
    (1, 2, 2, 32, [6]),
])
def test_paged_attention_matches_sdpa(block_size, hq, hkv, d, lens, dtype):
    gen = torch.Generator().manual_seed(1)
    t = max(lens)
    q = torch.randn(len(lens), hq, d, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(len(lens), hkv, t, d, device=DEVICE, dtype=dtype) for _ in range(2))
    lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    k_cache, v_cache, tables = paged_copy(k, v, lens, block_size, 3 * len(lens) * (-(-t // block_size)), gen)
    out = paged_attention(q, k_cache, v_cache, tables, lens)
    torch.testing.assert_close(out.float(), sdpa_decode(q, k, v, lens), atol=tol(dtype), rtol=tol(dtype))


def test_shared_blocks_and_holes(dtype):
    """Two sequences share their first two blocks (a common prompt); tables end in -1 holes."""
    q = torch.randn(2, 4, 32, device=DEVICE, dtype=dtype)
    k_cache, v_cache = (torch.randn(6, 8, 2, 32, device=DEVICE, dtype=dtype) for _ in range(2))
    tables = torch.tensor([[4, 0, 2, -1], [4, 0, 5, 1]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([20, 29], dtype=torch.int32, device=DEVICE)
    out = paged_attention(q, k_cache, v_cache, tables, lens, num_splits=2)
    torch.testing.assert_close(out.float(), paged_reference(q, k_cache, v_cache, tables, lens).float(),
                               atol=tol(dtype), rtol=tol(dtype))
    # a sequence reading the same blocks as the first, with the same query, gets the same answer
    same = paged_attention(q[[0, 0]], k_cache, v_cache, tables[[0, 0]], lens[[0, 0]])
    torch.testing.assert_close(same[0], same[1])


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 3), st.sampled_from([(1, 1), (4, 2), (4, 1)]), st.sampled_from([16, 32]),
       st.integers(1, 9), st.lists(st.integers(1, 40), min_size=1, max_size=3))
def test_paged_any_layout(seed, heads, d, block_size, lens):
    hq, hkv = heads
    gen = torch.Generator().manual_seed(seed)
    t = max(lens)
    q = torch.randn(len(lens), hq, d, generator=gen).to(DEVICE)
    k, v = (torch.randn(len(lens), hkv, t, d, generator=gen).to(DEVICE) for _ in range(2))
    lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    k_cache, v_cache, tables = paged_copy(k, v, lens, block_size, 2 * len(lens) * (-(-t // block_size)), gen)
    out = paged_attention(q, k_cache, v_cache, tables, lens)
    torch.testing.assert_close(out.float(), sdpa_decode(q, k, v, lens), atol=1e-4, rtol=1e-4)


def test_bad_tables_are_clear_errors():
    q = torch.randn(2, 4, 16, device=DEVICE)
    cache = torch.randn(3, 4, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"block_tables must be \[B=2"):
        paged_attention(q, cache, cache, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="seq_lens must have shape"):
        flash_decoding(q, cache.permute(2, 0, 1, 3)[:, :2], cache.permute(2, 0, 1, 3)[:, :2], torch.tensor([1]))


def test_bench_code_runs_on_tiny_shapes():
    """The GPU benchmarks' code paths (baselines, error columns, goals), on tiny shapes."""
    from inferlab.kernels import bench, flash_attention, paged_attention, w4a16_matmul
    dtype = torch.float32 if DEVICE == "cpu" else torch.float16  # SDPA's flash backend has no fp32 on GPUs
    kw = dict(batch=1, heads=4, kv_heads=2, head_dim=16, dtype=dtype, device=DEVICE)
    rows = flash_attention.bench(seq_lens=(40,), **kw) + paged_attention.bench(seq_lens=(32,), block_size=16, **kw)
    rows += w4a16_matmul.bench(shapes=((1, 64, 128),), group_size=32, dtype=dtype, device=DEVICE)
    assert [r["kernel"] for r in rows] == ["flash_attention", "paged_attention", "w4a16_matmul"]
    assert all(r["ratio"] > 0 and r["max_err"] < (1e-4 if dtype == torch.float32 else 2e-2) for r in rows)
    names = [g[0] for g in bench.goals(rows, 4.8e12)]
    assert names[0].startswith("flash_attention") and names[-1].startswith("w4a16")
