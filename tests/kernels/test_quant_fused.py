"""The quantized linears' fast paths against the dequantize-then-matmul reference, per format.

The compiled products (``inferlab.quant.fused``) must equal the reference up to float rounding and
must not touch ``dequantize`` (no fp32 weight); the int8 W8A8 path may differ only by the rounding
of its activations. Shapes stay small: each (format, shape, rows) compiles one C++ kernel.
``INFERLAB_QUANT_KERNEL=compiled`` keeps INT8 and INT4 off the VNNI loops, tested in test_quant_vnni.py."""
import logging

import pytest
import torch
from torch import nn

from inferlab.quant import GGMLLinear, Int4Linear, Int8Linear, NF4Linear, fused

MAKE = {
    "int8": Int8Linear.from_float,
    "int4": lambda lin: Int4Linear.from_float(lin, 64),
    "int4-g128": lambda lin: Int4Linear.from_float(lin, 128),  # one 16-word vector per group
    "int4-g32-3bit": lambda lin: Int4Linear.from_float(lin, 32, bits=3),
    "nf4": NF4Linear.from_float,
    "q8_0": lambda lin: GGMLLinear.from_float(lin, "q8_0"),
    "q4_0": lambda lin: GGMLLinear.from_float(lin, "q4_0"),
    "q4_1": lambda lin: GGMLLinear.from_float(lin, "q4_1"),
    "q4_k": lambda lin: GGMLLinear.from_float(lin, "q4_k"),
}


@pytest.fixture(autouse=True)
def compiled_products_only(monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")


def _no_dequantize():
    raise AssertionError("the fast path materialised the weight with dequantize()")


@pytest.fixture
def linear():
    torch.manual_seed(0)
    return nn.Linear(256, 48, bias=True)


@pytest.mark.parametrize("method", list(MAKE))
def test_fast_path_matches_reference_without_dequantizing(method, linear, monkeypatch):
    mod = MAKE[method](linear)
    x = torch.randn(1, 1, 256)
    with torch.inference_mode():
        ref = mod.forward_reference(x)
        monkeypatch.setattr(mod, "dequantize", _no_dequantize)
        out = mod(x)
    assert out.shape == ref.shape == (1, 1, 48)
    if method == "int8":  # activations rounded to int8: bounded by sum_k |w_k| * xs / 2
        w = Int8Linear.dequantize(mod)
        bound = w.abs().sum(1) * x.abs().amax() / 127 / 2
        assert ((out - ref).abs().flatten() <= bound + 1e-5).all()
        assert (out - ref).abs().max() > 0  # it did run the int8 x int8 product
    else:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_int4_act_order_and_several_rows(linear, monkeypatch):
    mod = Int4Linear.from_float(linear, 64)
    mod.perm = torch.randperm(256).to(torch.int32)  # act-order: the input is permuted first
    x = torch.randn(3, 256)
    with torch.inference_mode():
        ref = mod.forward_reference(x)
        monkeypatch.setattr(mod, "dequantize", _no_dequantize)
        torch.testing.assert_close(mod(x), ref, rtol=1e-5, atol=1e-5)


def test_many_rows_use_the_reference(linear):
    mod = MAKE["q4_0"](linear)
    x = torch.randn(fused.MAX_COMPILED_ROWS + 1, 256)
    with torch.inference_mode():
        assert torch.equal(mod(x), mod.forward_reference(x))


def test_eager_mode_and_missing_compiler_fall_back_to_the_reference(linear, monkeypatch, caplog):
    mod = MAKE["q8_0"](linear)
    x = torch.randn(1, 256)
    with torch.inference_mode():
        ref = mod.forward_reference(x)
        monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "eager")
        assert torch.equal(mod(x), ref)
        assert torch.equal(MAKE["int8"](linear)(x), MAKE["int8"](linear).forward_reference(x))
        monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")
        monkeypatch.setattr(fused, "_broken", [])
        monkeypatch.setattr(fused, "compiler_available", lambda: False)
        with caplog.at_level(logging.WARNING, logger="inferlab.quant.fused"):
            assert torch.equal(mod(x), ref)
            assert torch.equal(mod(x), ref)
    warnings = [r for r in caplog.records if "fall back" in r.getMessage()]
    assert len(warnings) == 1 and "C++ compiler" in warnings[0].getMessage()


def test_int8_follows_scales_changed_in_place(linear):
    mod = Int8Linear.from_float(linear)
    x = torch.randn(1, 256)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            before = mod(x) - mod.bias
            mod.scales.mul_(2)
            torch.testing.assert_close(mod(x) - mod.bias, 2 * before)
            mod.scales.div_(2)


def test_int4_group_sizes_the_word_layout_cannot_read_use_the_reference(monkeypatch):
    torch.manual_seed(0)
    mod = Int4Linear.from_float(nn.Linear(16, 8, bias=False), 4)  # half a word per group
    assert mod.fused() is None
    x = torch.randn(1, 16)
    with torch.inference_mode():
        assert torch.equal(mod(x), mod.forward_reference(x))


def test_int4_nibble_planes_hold_every_eighth_column_scaled():
    x = torch.arange(16.0).view(1, 16)
    planes, same = fused.nibble_planes(x)
    assert same is x and planes.shape == (1, 8, 2)
    assert planes[0, 1].tolist() == [1 / 16, 9 / 16] and planes[0, 7].tolist() == [7.0, 15.0]


def test_int4_qweight_stored_transposed_still_runs_the_word_layout(linear, monkeypatch):
    mod = Int4Linear.from_float(linear, 128)
    mod.qweight = mod.qweight.t().contiguous().t()  # same values, column-major (as a checkpoint may load)
    x = torch.randn(1, 256)
    with torch.inference_mode():
        ref = mod.forward_reference(x)
        monkeypatch.setattr(mod, "dequantize", _no_dequantize)
        torch.testing.assert_close(mod(x), ref, rtol=1e-5, atol=1e-5)
