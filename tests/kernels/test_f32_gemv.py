"""The float32 decode loop (inferlab/quant/f32.c) against torch's matmul: every row count a decode
step or a verify takes, each build this CPU runs (AVX-512 and AVX2 here; NEON under qemu in
tests/kernels/test_cross_builds.py), and the cases it must hand back to F.linear."""
import pytest
import torch
from torch import nn

from inferlab.model.linear import Linear, default_linear
from inferlab.quant import f32

needs_loop = pytest.mark.skipif(f32.loop() is None, reason="no C compiler or no vector build for this CPU")
ISAS = ["native", "avx2"]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    if request.param == "avx2":
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
        if f32.loop() is None or f32.loop().isa != "avx2":
            pytest.skip("no AVX2 build on this CPU")
    return f32.loop()


@needs_loop
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 32, 300])
@pytest.mark.parametrize("k,n", [(576, 1536), (1536, 576), (64, 12), (48, 8)])
def test_every_row_count_matches_torch(isa, rows, k, n):
    torch.manual_seed(rows * 7 + k)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    with torch.no_grad():
        y = f32.linear(x, w)
    assert y is not None
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-4)


@needs_loop
def test_a_row_is_the_same_bits_whatever_rows_run_beside_it(isa):
    """Up to 5 rows read the weights as one stream, more as tiles of 4 weight rows: both sum a row in
    the same order, so a sequence's logits do not depend on the batch or the verify it sits in."""
    torch.manual_seed(0)
    x, w = torch.randn(17, 576), torch.randn(960, 576)
    alone = f32.linear(x[:1], w)
    for rows in (2, 5, 6, 7, 8, 9, 13, 17):
        assert torch.equal(f32.linear(x[:rows], w)[:1], alone), rows


@needs_loop
def test_bias_leading_dims_and_a_strided_input(isa):
    torch.manual_seed(0)
    lin = nn.Linear(96, 40)
    x = torch.randn(2, 3, 192)[..., ::2]  # not contiguous: copied first
    with torch.no_grad():
        y = f32.linear(x, lin.weight, lin.bias)
        torch.testing.assert_close(y, lin(x), rtol=1e-5, atol=1e-5)
    assert y.shape == (2, 3, 40)


@needs_loop
def test_shapes_and_modes_it_does_not_take_go_to_torch(monkeypatch):
    w = torch.randn(16, 64)
    with torch.no_grad():
        assert f32.linear(torch.randn(1, 60), torch.randn(16, 60)) is None  # K not a vector multiple
        assert f32.linear(torch.randn(1, 64), torch.randn(18, 64)) is None  # N not a tile multiple
        assert f32.linear(torch.randn(1, 64, dtype=torch.float64), w.double()) is None
        assert f32.linear(torch.randn(1, 64), torch.randn(64, 16).T) is None  # a transposed view
    x = torch.randn(1, 64, requires_grad=True)
    assert f32.linear(x, w) is None  # autograd: torch keeps the graph
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "eager")
    with torch.no_grad():
        assert f32.linear(torch.randn(1, 64), w) is None


def test_the_default_linear_is_an_nn_linear_with_the_same_state_and_result():
    torch.manual_seed(0)
    lin = default_linear(64, 32, True, "q_proj")
    assert isinstance(lin, Linear) and isinstance(lin, nn.Linear)
    assert set(lin.state_dict()) == {"weight", "bias"}
    x = torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    lin(x).sum().backward()  # training takes torch's path and gets gradients
    assert lin.weight.grad is not None


@needs_loop
def test_a_compiled_step_calls_the_loop_as_an_op():
    torch.manual_seed(0)
    lin = default_linear(64, 32, False, "q_proj")
    x = torch.randn(2, 64)
    with torch.no_grad():
        compiled = torch.compile(lin, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), x @ lin.weight.T, rtol=1e-5, atol=1e-5)
