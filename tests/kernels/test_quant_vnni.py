"""The VNNI int8/int4 decode loops (``inferlab/quant/vnni.c``) against the dequantize-then-matmul
reference and against the same integer arithmetic written in torch.

The loops quantize the activations to int8 before multiplying, so they differ from the reference by
that rounding only: at most ``sum_k |w_nk| * xs / 2`` per output, where xs is the activation scale
of the row (INT8) or group (INT4). The torch model of the arithmetic (``_w8a8``, ``_w4a8``) must
match to float rounding: it catches swapped nibbles, a lost zero point, a wrong group's scale or a
short tail, which the looser bound could hide.

The arithmetic tests run once per build: the CPU's best (AVX-512 VNNI, else AVX2), the AVX2 build
(avx2.c, skipped on CPUs without AVX2) and the portable build, the same vnni.c with its intrinsics
written in plain C (vnni_portable.h), which runs on every machine with a C compiler. So a bug in
the VNNI loops fails these tests everywhere, not only where the fast build runs, and a bug in the
AVX2 loops on every x86 machine CI has."""
import logging

import pytest
import torch
from torch import nn

from inferlab.quant import GGMLLinear, Int4Linear, Int8Linear, NF4Linear, fused, vnni
from inferlab.quant.nf4 import NF4_CODE, NF4_TABLE, nf4_table

needs_vnni = pytest.mark.skipif(not vnni.available(), reason="no AVX-512 VNNI CPU or C compiler here")


@pytest.fixture(params=vnni.BUILDS)
def loops(request, monkeypatch):
    """The build of the loops the quantized linears call in this test (``vnni.BUILDS``)."""
    monkeypatch.setenv("INFERLAB_VNNI_BUILD", request.param)
    if not vnni.available():
        pytest.skip(f"the {request.param} build of the VNNI loops cannot run here")
    return request.param


def _codes(x: torch.Tensor, top: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] -> (codes, scale [..., 1]) the way vnni.c rounds: x * (top / amax), half to even."""
    amax = x.abs().amax(-1, keepdim=True)
    # a tensor by a tensor: `top / amax` would be amax.reciprocal() * top (Python's reflected
    # division), one rounding more than C's levels / amax, and a product near a tie rounds otherwise
    inv = torch.where(amax > 0, torch.full_like(amax, top) / amax, torch.zeros_like(amax))
    return torch.round(x * inv), amax / top


def _w8a8(x: torch.Tensor, mod: Int8Linear) -> torch.Tensor:
    M, K = x.shape
    xq, xs = _codes(x.view(M, K // 32, 32), 32767)  # 16-bit codes, one scale per block of 32
    dot = torch.einsum("mbk,nbk->mnb", xq.double(), mod.qweight.view(-1, K // 32, 32).double())  # exact
    return (dot.float() * xs.view(M, 1, K // 32)).sum(-1) * mod.scales.float()


def _w4a8(x: torch.Tensor, mod: Int4Linear) -> torch.Tensor:
    M, K = x.shape
    G = K // mod.group_size
    xq, xs = _codes(x.view(M, G, mod.group_size))
    q = torch.stack((mod.qweight & 15, mod.qweight >> 4), -1).flatten(-2).view(-1, G, mod.group_size)
    dot = torch.einsum("mgk,ngk->mng", xq.double(), q.double()) - mod.zeros.double() * xq.double().sum(-1)[:, None]
    return (dot.float() * xs.view(M, 1, G) * mod.scales.float()).sum(-1)


def _bound(x: torch.Tensor, w: torch.Tensor, group: int) -> torch.Tensor:
    """sum_k |w_nk| * xs_g(k) / 2 for each row of x: the activations' rounding, the only difference allowed."""
    M, K = x.shape
    xs = x.view(M, K // group, group).abs().amax(-1) / 127  # [M, G]
    return (w.abs().view(w.shape[0], K // group, group).sum(-1) * xs[:, None, :]).sum(-1) / 2  # [M, N]


@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("k", [256, 96])  # 96: three blocks of 32, not a whole 64-byte vector
@pytest.mark.parametrize("n", [40, 48])  # 48: three tiles of 16 outputs (the tiles' loop), 40: the plain one
def test_int8_matches_its_arithmetic_and_the_reference(loops, rows, k, n):
    """16-bit activations: the float product to ~1e-5 of each block's largest activation."""
    torch.manual_seed(rows + k)
    mod = Int8Linear.from_float(nn.Linear(k, n, bias=True))
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)  # blocks of different scales
    x[0, :5] = 0.0
    with torch.inference_mode():
        out, ref = mod(x), mod.forward_reference(x)
    torch.testing.assert_close(out - mod.bias, _w8a8(x, mod), rtol=1e-5, atol=1e-5)
    bound = (mod.dequantize().abs() @ x.view(rows, k // 32, 32).abs().amax(-1).repeat_interleave(32, -1).t()).t()
    assert ((out - ref).abs() <= bound / 32767 / 2 + 1e-5).all()


def test_int8_widths_off_the_block_size_leave_the_loop():
    mod = Int8Linear.from_float(nn.Linear(200, 8))
    assert vnni.int8_linear(torch.randn(1, 200), mod.qweight, mod.scales) is None


@pytest.mark.parametrize("group,bits,k", [(128, 4, 512), (256, 4, 512), (128, 3, 512),
                                          (64, 4, 576), (192, 4, 576)])  # 576 = SmolLM2's width: groups of 64
@pytest.mark.parametrize("rows", [1, 2, 32])
@pytest.mark.parametrize("n", [40, 48])  # 48: three tiles of 16 outputs (the tiles' loop), 40: the plain one
def test_int4_matches_its_arithmetic_and_the_reference(loops, group, bits, k, rows, n):
    torch.manual_seed(group + rows)
    mod = Int4Linear.from_float(nn.Linear(k, n, bias=False), group, bits)
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)  # groups of different scales
    with torch.inference_mode():
        out, ref = mod(x), mod.forward_reference(x)
    torch.testing.assert_close(out, _w4a8(x, mod), rtol=1e-4, atol=1e-4)
    assert ((out - ref).abs() <= _bound(x, mod.dequantize(), group) + 1e-4).all()
    assert (out - ref).abs().max() > 0


@pytest.mark.parametrize("ggml_type,k", [("q8_0", 256), ("q4_0", 256), ("q4_1", 256), ("q4_k", 256),
                                         ("q4_0", 96), ("q4_1", 96)])  # 96: Q4's pairs of blocks, then one left
@pytest.mark.parametrize("rows", [1, 2, 5, 32])
def test_llama_cpp_blocks_match_their_arithmetic_and_the_reference(loops, ggml_type, k, rows):
    """Activations rounded per block of 32, then the exact product with the dequantized blocks."""
    torch.manual_seed(rows)
    mod = GGMLLinear.from_float(nn.Linear(k, 40, bias=True), ggml_type)
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)
    xq, xs = _codes(x.view(rows, k // 32, 32))
    with torch.inference_mode():
        out, ref = mod(x), mod.forward_reference(x)
        model = (xq * xs).view(rows, k) @ mod.dequantize().t()
    torch.testing.assert_close(out - mod.bias, model, rtol=1e-4, atol=1e-4)
    assert ((out - ref).abs() <= _bound(x, mod.dequantize(), 32) + 1e-4).all()
    assert (out - ref).abs().max() > 0


@pytest.mark.parametrize("ggml_type", vnni.TILED_TYPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 10, 17])  # the AVX-512 tiles: 6 rows a pass, 10 = 6 + 4
def test_tiles_of_16_outputs_are_the_blocks_arithmetic(loops, ggml_type, rows):
    """The loops over tiles of 16 outputs (48 outputs: three tiles) compute what the plain loops do:
    the same rounded activations against the dequantized blocks, in another order."""
    torch.manual_seed(rows)
    k = 512 if ggml_type == "q4_k" else 96  # Q4_K: two super-blocks of 256
    mod = GGMLLinear.from_float(nn.Linear(k, 48, bias=False), ggml_type)
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)
    xq, xs = _codes(x.view(rows, k // 32, 32))
    with torch.inference_mode():
        out = mod(x)
        plain = vnni.ggml_gemv(x, mod.qweight, ggml_type)
    assert ("tiles" in mod.__dict__.get("_derived", {})) == vnni.tiles_available()  # the forward used them
    model = (xq * xs).view(rows, k) @ mod.dequantize().t()
    torch.testing.assert_close(out, model, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)


def test_tiles_follow_a_weight_changed_in_place(loops):
    torch.manual_seed(0)
    mod, other = (GGMLLinear.from_float(nn.Linear(64, 32, bias=False), "q4_1") for _ in range(2))
    x = torch.randn(2, 64)
    with torch.no_grad():
        mod(x)
        mod.qweight.copy_(other.qweight)
        torch.testing.assert_close(mod(x), other(x))


def _nf4a8(x: torch.Tensor, mod: NF4Linear) -> torch.Tensor:
    """NF4's loops in torch: code values as round(127 * code), activations rounded per block of the
    weight, exact integer sums, then absmax / 127 and the activation scale per block."""
    M, K = x.shape
    B = mod.blocksize
    xq, xs = _codes(x.view(M, K // B, B))
    q = torch.stack((mod.qweight >> 4, mod.qweight & 15), -1).reshape(-1).long()  # high nibble first
    t = torch.round(NF4_CODE * 127)[q].view(mod.out_features, K // B, B)
    dot = torch.einsum("mbk,nbk->mnb", xq.double(), t.double())  # exact
    return (dot.float() * xs.view(M, 1, K // B) * (mod.absmax.view(mod.out_features, K // B) * (1 / 127))).sum(-1)


@pytest.mark.parametrize("blocksize,k", [(64, 576), (128, 256), (32, 96)])
@pytest.mark.parametrize("rows", [1, 3, 5, 10])  # the AVX-512 tiles: 6 rows a pass, 10 = 6 + 4
@pytest.mark.parametrize("n", [40, 48])  # 48: three tiles of 16 outputs (the tiles' loop), 40: the plain one
def test_nf4_matches_its_arithmetic_and_the_reference(loops, blocksize, k, rows, n, monkeypatch):
    """NF4's loops multiply int8 code values (round(127 * code)) by int8 activations: the torch model
    of that arithmetic to float rounding, and the reference within the activations' rounding plus the
    code values' (at most absmax / 254 a weight), without dequantizing."""
    torch.manual_seed(blocksize + rows)
    mod = NF4Linear.from_float(nn.Linear(k, n, bias=True), blocksize)
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)  # blocks of different scales
    with torch.inference_mode():
        ref = mod.forward_reference(x)
        monkeypatch.setattr(mod, "dequantize", lambda: pytest.fail("the loop dequantized the weight"))
        out = mod(x)
        plain = vnni.nf4_linear(x, mod.qweight, mod.absmax, NF4_TABLE, blocksize)
    assert ("tiles" in mod.__dict__.get("_derived", {})) == (n % 16 == 0 and vnni.tiles_available())
    torch.testing.assert_close(out - mod.bias, _nf4a8(x, mod), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out - mod.bias, plain, rtol=1e-5, atol=1e-5)  # tiles and rows: one arithmetic
    w = mod.absmax.repeat_interleave(blocksize).view(n, k)  # each weight's absmax
    table_error = (x.abs() @ w.t()) / 254
    assert ((out - ref).abs() <= _bound(x, NF4Linear.dequantize(mod).abs() + w / 254, blocksize) + table_error + 1e-4).all()
    assert (out - ref).abs().max() > 0


def test_nf4_loops_read_the_table(loops):
    """A table of zeros (t = 0 for every code) gives zeros, in the plain loop and in the tiles."""
    torch.manual_seed(0)
    mod = NF4Linear.from_float(nn.Linear(128, 32, bias=False), 64)
    x = torch.randn(3, 128)
    zeros = nf4_table(torch.zeros(16))
    assert vnni.nf4_linear(x, mod.qweight, mod.absmax, zeros, 64).abs().max() == 0
    if vnni.tiles_available():
        tiles = mod.tiles().clone()
        tiles[:64] = zeros
        assert vnni.nf4_tiles_linear(x, tiles, 32, 64).abs().max() == 0


def test_int4_act_order_permutes_before_the_loop(loops):
    torch.manual_seed(0)
    mod = Int4Linear.from_float(nn.Linear(256, 32, bias=True), 128)
    mod.perm = torch.randperm(256).to(torch.int32)
    x = torch.randn(2, 256)
    with torch.inference_mode():
        out, ref = mod(x), mod.forward_reference(x)
    xp = x[:, mod.perm.long()]
    torch.testing.assert_close(out - mod.bias, _w4a8(xp, mod), rtol=1e-4, atol=1e-4)
    assert ((out - ref).abs() <= _bound(xp, mod.dequantize(), 128) + 1e-4).all()


@needs_vnni
def test_other_group_sizes_and_modes_leave_the_loop_and_a_prompt_stays(monkeypatch):
    torch.manual_seed(0)
    lin = nn.Linear(256, 32)
    x = torch.randn(1, 256)
    g32 = Int4Linear.from_float(lin, 32)  # not a multiple of 64: the compiled product
    assert vnni.int4_linear(x, g32.qweight, g32.scales, g32.zeros, 32) is None
    g128 = Int4Linear.from_float(lin, 128)
    prompt = torch.randn(100, 256)  # a prompt's rows run the same integer arithmetic as a decode's
    torch.testing.assert_close(vnni.int4_linear(prompt, g128.qweight, g128.scales, g128.zeros, 128),
                               _w4a8(prompt, g128), rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")
    assert vnni.int4_linear(x, g128.qweight, g128.scales, g128.zeros, 128) is None
    with torch.inference_mode():  # and the compiled product is exact where the loop is not
        torch.testing.assert_close(g128(x), g128.forward_reference(x), rtol=1e-5, atol=1e-5)


@needs_vnni
def test_a_compiled_graph_calls_the_loops_as_ops():
    torch.manual_seed(0)
    lin = nn.Linear(256, 32)
    m8, m4 = Int8Linear.from_float(lin), Int4Linear.from_float(lin, 128)
    x = torch.randn(1, 256)
    with torch.inference_mode():
        eager = m8(x) + 2 * m4(x)
        compiled = torch.compile(lambda x: m8(x) + 2 * m4(x), fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager)


def _clear():
    vnni._native_library.cache_clear()
    vnni._avx2_library.cache_clear()


def test_torch_capped_below_avx512_runs_the_avx2_loops(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # as on an AVX2 laptop
    _clear()
    try:
        assert vnni.isa() == ("avx2" if vnni._avx2_library() is not None else None)
        monkeypatch.setenv("INFERLAB_VNNI_BUILD", "portable")  # the tests' build runs all the same
        assert vnni.isa() == "portable" or not vnni.fused.compiler_available()
        monkeypatch.setenv("INFERLAB_VNNI_BUILD", "avx-2")
        with pytest.raises(ValueError, match="use one of native, avx2, portable"):
            vnni.available()
    finally:
        _clear()


def test_a_failed_build_is_said_once_and_the_compiled_products_run(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    monkeypatch.setattr(vnni.platform, "machine", lambda: "x86_64")
    _clear()
    try:
        with caplog.at_level(logging.WARNING, logger="inferlab.quant.vnni"):
            assert not vnni.available() and not vnni.available()
        mod = Int4Linear.from_float(nn.Linear(256, 16), 128)
        x = torch.randn(1, 256)
        with torch.inference_mode():
            torch.testing.assert_close(mod(x), mod.forward_reference(x), rtol=1e-5, atol=1e-5)
    finally:
        _clear()
    said = [r.getMessage() for r in caplog.records if "did not build" in r.getMessage()]
    assert said and len(said) == len(set(said))  # each build that failed is said once
    assert not list(tmp_path.rglob("*.so"))  # nothing half-written left in the cache


def _half_way_activations(rows: int, k: int, top: int = 127) -> torch.Tensor:
    """Rows of blocks of 32 whose largest |x| is 3 and whose other values x give x * (top / 3), rounded
    to a float, exactly k + 1/2, where the exact product is not: rounded once more (half to even),
    as torch rounds, each lands on the even side; a multiply-add that fuses x * inv with the
    rounding's addition sees the exact product and rounds some of them the other way."""
    import numpy as np
    inv = np.float32(top) / np.float32(3.0)
    found = []
    for half in np.arange(0.5, top - 1, 1.0):
        x = np.float32(half / np.float64(inv))
        for step in range(-3, 4):
            c = np.nextafter(x, np.float32(np.inf) if step > 0 else np.float32(-np.inf))
            c = x if step == 0 else c
            for _ in range(abs(step) - 1):
                c = np.nextafter(c, np.float32(np.inf) if step > 0 else np.float32(-np.inf))
            exact = np.float64(c) * np.float64(inv)  # exact: 24 + 24 bits
            if np.float32(exact) == half and exact != half:
                found.append(float(c))
                break
    vals = torch.tensor(found)
    assert len(vals) > 20
    x = vals[torch.arange(rows * k) % len(vals)].view(rows, k // 32, 32)
    x = x * torch.where(torch.arange(rows * k).view(rows, k // 32, 32) % 3 == 0, -1.0, 1.0)
    x[:, :, 7] = 3.0  # each block's largest |x|
    return x.view(rows, k)


@pytest.mark.parametrize("ggml_type,n", [("q8_0", 40), ("q8_0", 48), ("q4_1", 48)])
def test_activations_half_way_between_codes_round_as_torch_rounds(loops, ggml_type, n):
    """The quantizer rounds x * inv to a float, then to the nearest code, half to even: a compiler
    that fuses the product into the rounding's arithmetic (an FMA) rounds once, and moves codes
    that lie half way. Plain rows (40 outputs) and tiles (48) of blocks, and INT4's split layout."""
    torch.manual_seed(0)
    k, rows = 128, 3
    x = _half_way_activations(rows, k)
    mod = GGMLLinear.from_float(nn.Linear(k, n, bias=False), ggml_type)
    xq, xs = _codes(x.view(rows, k // 32, 32))
    with torch.inference_mode():
        out = mod(x)
    model = (xq * xs).view(rows, k) @ mod.dequantize().t()
    torch.testing.assert_close(out, model, rtol=1e-5, atol=1e-5)
    imod = Int4Linear.from_float(nn.Linear(k, 32, bias=False), 64, 4)
    with torch.inference_mode():
        iout = imod(x)
    torch.testing.assert_close(iout, _w4a8(x, imod), rtol=1e-5, atol=1e-5)
