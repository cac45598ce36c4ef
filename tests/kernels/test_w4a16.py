"""W4A16: the packed layout decoded by hand, and the fused kernel against dequantize-then-matmul."""
import pytest
import torch

from inferlab.kernels.w4a16_matmul import dequantize_int4, quantize_int4, w4a16_matmul
from tests.kernels.conftest import DEVICE


def test_dequantize_follows_the_layout_byte_by_byte():
    g = torch.Generator().manual_seed(0)
    n, k, group = 3, 32, 16
    codes = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(0, 16, (n, k // group), generator=g).to(torch.uint8)
    scales = torch.rand(n, k // group, generator=g).half()
    qweight = torch.zeros(n, k // 2, dtype=torch.uint8)
    expected = torch.zeros(n, k)
    for r in range(n):
        for j in range(k // 2):
            qweight[r, j] = int(codes[r, 2 * j]) | (int(codes[r, 2 * j + 1]) << 4)  # low nibble = even column
        for c in range(k):
            expected[r, c] = (int(codes[r, c]) - int(zeros[r, c // group])) * float(scales[r, c // group])
    torch.testing.assert_close(dequantize_int4(qweight, scales, zeros, torch.float32), expected)


def test_quantize_round_trip_error_is_within_half_a_step():
    w = torch.randn(8, 64)
    qw, s, z = quantize_int4(w, 32)
    err = (dequantize_int4(qw, s, z, torch.float32) - w).abs()
    assert (err <= s.float().repeat_interleave(32, 1) * 0.51 + 1e-3).all()


@pytest.mark.parametrize("m,n,k,group", [(1, 40, 96, 32), (5, 33, 128, 64), (17, 70, 256, 16), (3, 8, 64, 64)])
def test_matches_dequantize_then_matmul(m, n, k, group, dtype):
    x = torch.randn(m, k, device=DEVICE, dtype=dtype)
    qw, s, z = quantize_int4(torch.randn(n, k, device=DEVICE), group)
    expected = x.float() @ dequantize_int4(qw, s, z, torch.float32).T
    out = w4a16_matmul(x, qw, s, z)
    assert out.shape == (m, n) and out.dtype == dtype
    rel = ((out.float() - expected).abs().max() / expected.abs().max()).item()
    assert rel < (1e-5 if dtype == torch.float32 else 1e-2), rel


def test_batched_input_keeps_its_leading_shape():
    x = torch.randn(2, 3, 64, device=DEVICE, dtype=torch.float32 if DEVICE == "cpu" else torch.float16)
    qw, s, z = quantize_int4(torch.randn(24, 64, device=DEVICE), 32)
    out = w4a16_matmul(x, qw, s, z)
    assert out.shape == (2, 3, 24)
    torch.testing.assert_close(out, w4a16_matmul(x.reshape(6, 64), qw, s, z).view(2, 3, 24))


def test_bad_layouts_are_clear_errors():
    x = torch.randn(1, 64, device=DEVICE)
    qw, s, z = quantize_int4(torch.randn(8, 64, device=DEVICE), 32)
    with pytest.raises(ValueError, match="qweight packs 64"):
        w4a16_matmul(torch.randn(1, 32, device=DEVICE), qw, s, z)
    with pytest.raises(ValueError, match="must be uint8"):
        w4a16_matmul(x, qw.int(), s, z)
    with pytest.raises(ValueError, match=r"scales and zeros must be \[N=8"):
        w4a16_matmul(x, qw, s[:, :1], z)


def test_agrees_with_the_quantization_package():
    """The INT4 layout has two readers: the quantization package's torch code and this kernel."""
    quant = pytest.importorskip("inferlab.quant.int4")
    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 128, generator=g)
    qweight, scales, zeros = quant.quantize_int4(w, group_size=32)
    ours = dequantize_int4(qweight, scales, zeros, torch.float32)
    torch.testing.assert_close(ours, quant.dequantize_int4(qweight, scales, zeros, 32), rtol=0, atol=0)
    x = torch.randn(3, 128, generator=g).to(DEVICE)
    x = x if DEVICE == "cpu" else x.half()
    got = w4a16_matmul(x, qweight.to(DEVICE), scales.to(DEVICE), zeros.to(DEVICE)).float()
    want = x.float() @ ours.to(DEVICE).T
    assert ((got - want).abs().max() / want.abs().max()).item() < (1e-5 if DEVICE == "cpu" else 1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernel runs on CUDA; the CPU path is tests/kernels/test_quant_fused.py")
def test_int4_linear_on_cuda_runs_the_fused_kernel():
    """Int4Linear.forward on CUDA goes through this kernel and equals dequantize-then-matmul."""
    from inferlab.quant.int4 import Int4Linear

    lin = torch.nn.Linear(128, 40, bias=True)
    q = Int4Linear.from_float(lin, group_size=32).cuda()
    x = torch.randn(5, 128, device="cuda", dtype=torch.float16)
    want = torch.nn.functional.linear(x.float(), q.dequantize().float(), q.bias.float())
    got = q(x).float()
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-2
