"""The decode step's small C loops (inferlab/model/glue.c, inferlab/attention/cpu_decode.c) against
their torch references: RMSNorm, RoPE on the strided q/k views of a packed projection, and paged
decode attention with ragged contexts, GQA and a sliding window; the places they step aside; and
the model through them against transformers' (tests/models covers the rest)."""
import pytest
import torch
import torch.nn.functional as F

from inferlab.attention import cpu_decode
from inferlab.attention.paged import paged_decode as torch_paged_decode
from inferlab.model import glue
from inferlab.model.rope import apply_rope, rope_cos_sin, rope_inv_freq
from inferlab.native import library

needs_c = pytest.mark.skipif(library(glue.SOURCE, ()) is None, reason="no C compiler")


@needs_c
@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 7, 64), (3, 2, 100), (1, 300, 576)])
def test_rms_norm_matches_torch(shape):
    torch.manual_seed(sum(shape))
    x, w = torch.randn(shape) * 3, torch.randn(shape[-1])
    with torch.no_grad():
        y = glue.rms_norm(x, w, 1e-5)
    assert y is not None
    torch.testing.assert_close(y, F.rms_norm(x, w.shape, w, 1e-5), rtol=1e-5, atol=1e-6)


@needs_c
@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 65, 1000, 49152])
def test_argmax_is_torchs_first_maximum(n):
    """Greedy tokens from the C loop against torch's ``max(-1).indices`` (and ``argmax``): random
    rows, a maximum repeated early and late (within and beyond the first chunk of 64), -0 before
    +0, rows of -inf, +inf and a NaN (torch gives the first NaN), 2 and 3 dims."""
    torch.manual_seed(n)
    x = torch.randn(12, n)
    if n > 1:
        x[1, n // 2] = x[1, n - 1] = 50.0                   # a tie: the first wins
        x[2, :] = 7.0                                       # all equal: position 0
        x[3, n - 1] = float("inf")
        x[4, n // 3] = float("nan")
        x[5, n - 1] = float("nan")
        x[5, 0] = float("inf")
        x[6, :] = float("-inf")
        x[7, (n * 2) // 3] = x[7, n // 4] = 9.0
        x[8] = -x[8].abs() - 1
        x[8, n // 5], x[8, n - 1] = -0.0, 0.0               # -0 == +0: the first of them
    got = glue.argmax(x)
    assert got is not None and got.dtype == torch.int64
    assert torch.equal(got, x.max(-1).indices), (got, x.max(-1).indices)
    assert torch.equal(got[7:8], x[7:8].argmax(-1))
    assert torch.equal(glue.argmax(x.view(3, 4, n)), x.view(3, 4, n).max(-1).indices)


@needs_c
@pytest.mark.parametrize("rows", [1, 5, 32, 300])
def test_silu_mul_matches_torch_on_the_halves_of_a_packed_output(rows):
    """SwiGLU's gate from the two strided halves of a packed gate|up output, over gate values from
    -95 to 95 (exp clamped past -87 and 88): within a few float ulps of torch where the result is
    a normal float, a prompt's many rows (on two threads) as a decode step's few."""
    torch.manual_seed(rows)
    f = 1536
    packed = torch.randn(1, rows, 2 * f) * 4
    packed[0, 0, :f] = torch.linspace(-95, 95, f)
    gate, up = packed.split([f, f], -1)
    with torch.no_grad():
        got = glue.silu_mul(gate, up)
    want = (F.silu(gate.double()) * up.double()).float()
    assert got is not None and got.shape == gate.shape
    normal = want.abs() > 1e-30
    torch.testing.assert_close(got[normal], want[normal], rtol=2e-6, atol=0)
    assert (got[~normal].abs() < 1e-30).all()


@needs_c
@pytest.mark.parametrize("tokens", [1, 5])
def test_rope_rotates_the_q_and_k_views_of_a_packed_projection_in_place(tokens):
    torch.manual_seed(tokens)
    hq, hkv, d = 9, 3, 64
    packed = torch.randn(1, tokens, (hq + 2 * hkv) * d)
    q, k, v = packed.split([hq * d, hkv * d, hkv * d], -1)
    q = q.view(1, tokens, hq, d).transpose(1, 2)
    k = k.view(1, tokens, hkv, d).transpose(1, 2)
    v_before = v.clone()
    positions = torch.arange(40, 40 + tokens)[None]
    cos, sin = rope_cos_sin(rope_inv_freq(d, 1e5), positions, torch.float32)
    want_q, want_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    with torch.no_grad():
        assert glue.rope_(cos, sin, q, k)
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, want_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(v, v_before)  # the v part of the same buffer is left alone


def _cache(num_slots, hkv, d):
    return torch.randn(num_slots, hkv, d), torch.randn(num_slots, hkv, d)


@needs_c
@pytest.mark.parametrize("hq,hkv", [(9, 3), (4, 4), (8, 1)])
def test_paged_decode_matches_the_torch_path_on_ragged_contexts(hq, hkv):
    torch.manual_seed(hq * 10 + hkv)
    d, bs = 64, 16
    k_slots, v_slots = _cache(64 * bs, hkv, d)
    lens = torch.tensor([37, 5, 64])
    s = int(lens.max())
    tables = torch.stack([torch.randperm(64)[:4] for _ in lens])  # scattered blocks
    slots = (tables[:, :, None] * bs + torch.arange(bs)).view(len(lens), -1)[:, :s]
    q = torch.randn(len(lens), hq, d)
    bias = torch.zeros(len(lens), s).masked_fill_(torch.arange(s)[None] >= lens[:, None], float("-inf"))
    with torch.no_grad():
        got = cpu_decode.paged_decode(q, k_slots, v_slots, slots, lens)
        want = torch_paged_decode(q, k_slots, v_slots, slots, bias[:, None, None])
    assert got is not None
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_c
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (16, 1, 32), (4, 2, 128), (2, 1, 48)])
@pytest.mark.parametrize("lens", [[517], [1, 33, 300], [64, 0, 95, 32, 7]])
def test_paged_decode_over_many_chunks_and_split_contexts(hq, hkv, d, lens):
    """Contexts of several chunks of 32 keys, whose running max grows from chunk to chunk (the online
    softmax's rescaling); one sequence, whose context is cut into parts for the threads and merged;
    more query heads per K/V head than one piece takes (16 to 1); a context of no keys."""
    torch.manual_seed(len(lens) * 100 + d)
    bs, blocks = 16, 64
    k_slots, v_slots = _cache(blocks * bs, hkv, d)
    k_slots[::7] *= 4  # a few keys far above the rest: the max moves late in a context
    lens = torch.tensor(lens)
    s = max(int(lens.max()), 1)
    tables = torch.stack([torch.randperm(blocks)[:(s + bs - 1) // bs] for _ in lens])
    slots = (tables[:, :, None] * bs + torch.arange(bs)).view(len(lens), -1)[:, :s].contiguous()
    q = torch.randn(len(lens), hq, d)
    bias = torch.zeros(len(lens), s).masked_fill_(torch.arange(s)[None] >= lens[:, None], float("-inf"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the split into parts happens with more than one thread, whatever the machine
    try:
        with torch.no_grad():
            got = cpu_decode.paged_decode(q, k_slots, v_slots, slots, lens)
            want = torch_paged_decode(q, k_slots, v_slots, slots, bias[:, None, None])
    finally:
        torch.set_num_threads(threads)
    assert got is not None
    want = torch.where(lens[:, None, None] > 0, want, 0.0)  # no keys: zero (torch: NaN)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_c
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_attention_is_the_same_bits_alone_in_a_batch_or_in_a_verify(threads):
    """Batch invariance: a row's output depends on its own query and context only. A decode row
    alone, the same row beside seven others, and the same row as the first of a speculative verify
    (four rows of one sequence) give identical bits, under 1 and 2 threads: otherwise a greedy
    output changes when speculation or batching is switched on (a near-tie flips)."""
    torch.manual_seed(7)
    bs, blocks, hq, hkv, d = 16, 64, 9, 3, 64
    k_slots, v_slots = _cache(blocks * bs, hkv, d)
    lens = torch.tensor([300, 40, 700, 129, 1, 256, 90, 513])
    s = int(lens.max())
    tables = torch.stack([torch.randperm(blocks)[:(s + bs - 1) // bs] for _ in lens])
    slots = (tables[:, :, None] * bs + torch.arange(bs)).view(len(lens), -1)[:, :s].contiguous()
    q = torch.randn(len(lens), hq, d)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            batch = cpu_decode.paged_decode(q, k_slots, v_slots, slots, lens)
            alone = [cpu_decode.paged_decode(q[i:i + 1], k_slots, v_slots, slots[i:i + 1].contiguous(), lens[i:i + 1])
                     for i in range(len(lens))]
            # a verify of 4 rows of sequence 0: its rows see 300, 301, 302 and 303 positions
            verify = cpu_decode.paged_decode(torch.cat([q[:1], torch.randn(3, hq, d)]), k_slots, v_slots,
                                             torch.cat([slots[:1]] * 4).contiguous(), torch.tensor([300, 301, 302, 303]))
    finally:
        torch.set_num_threads(before)
    for i in range(len(lens)):
        assert torch.equal(batch[i], alone[i][0]), i
    assert torch.equal(verify[0], alone[0][0])


@needs_c
def test_paged_decode_under_a_sliding_window_sees_only_the_last_positions():
    torch.manual_seed(3)
    d, window = 32, 8
    k_slots, v_slots = _cache(128, 2, d)
    lens = torch.tensor([30, 6])
    slots = torch.stack([torch.randperm(128)[:30], torch.randperm(128)[:30]])
    q = torch.randn(2, 4, d)
    pos = torch.arange(30)[None]
    visible = (pos < lens[:, None]) & (pos > lens[:, None] - 1 - window)
    bias = torch.zeros(2, 30).masked_fill_(~visible, float("-inf"))
    with torch.no_grad():
        got = cpu_decode.paged_decode(q, k_slots, v_slots, slots, lens, window)
        want = torch_paged_decode(q, k_slots, v_slots, slots, bias[:, None, None])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_c
def test_what_the_loops_do_not_take_goes_to_torch(monkeypatch):
    x, w = torch.randn(1, 8), torch.randn(8)
    cos = sin = torch.randn(1, 1, 1, 8)
    with torch.no_grad():
        assert glue.rms_norm(x.double(), w.double(), 1e-5) is None
        assert glue.rms_norm(torch.randn(8, 2).T, w[:2], 1e-5) is None  # not contiguous
        assert glue.argmax(x.double()) is None and glue.argmax(torch.randn(8, 2).T) is None
        assert not glue.rope_(cos, sin, torch.randn(2, 1, 1, 8))  # a batch of two: positions differ
        q = torch.randn(1, 1, 1, 8)
        before = q.clone()
        assert not glue.rope_(cos, sin, q, torch.randn(1, 1, 1, 8).double())  # one refused: none rotated
        assert torch.equal(q, before)
    assert glue.rms_norm(torch.randn(1, 8, requires_grad=True), w, 1e-5) is None  # autograd
    for knob, value in (("INFERLAB_QUANT_KERNEL", "eager"), ("ATEN_CPU_CAPABILITY", "default")):
        with monkeypatch.context() as m, torch.no_grad():
            m.setenv(knob, value)
            assert glue.rms_norm(x, w, 1e-5) is None and glue.argmax(x) is None
            assert cpu_decode.paged_decode(torch.randn(1, 2, 8), *_cache(4, 2, 8), torch.arange(4)[None],
                                           torch.tensor([4])) is None
