"""Packed formats against references nobody here wrote: llama.cpp's gguf package and bitsandbytes."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.quant import ggml, hub
from inferlab.quant.int4 import Int4Linear, dequantize_int4, pack_int4, quantize_int4, unpack_int4
from inferlab.quant.nf4 import NF4Linear, dequantize_nf4, quantize_nf4


def weights(rows=48, cols=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    w[3, 7], w[5, cols - 20] = 1.2, -0.9  # outliers, as trained weights have
    return w


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.integers(1, 16), st.integers(0, 2**31 - 1))
def test_int4_pack_unpack_bit_exact(rows, half_cols, seed):
    q = torch.randint(0, 16, (rows, 2 * half_cols), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, half_cols)
    assert torch.equal(packed, q[:, 0::2] | (q[:, 1::2] << 4))  # low nibble = even column
    assert torch.equal(unpack_int4(packed), q)


def test_dequantize_int4_follows_the_formula():
    w = weights(8, 256)
    qweight, scales, zeros = quantize_int4(w, 64)
    assert qweight.shape == (8, 128) and scales.dtype == torch.float16 and zeros.dtype == torch.uint8
    assert scales.shape == zeros.shape == (8, 4) and int(zeros.max()) <= 15
    q = unpack_int4(qweight).float()
    n, k = 5, 200
    expected = (q[n, k] - zeros[n, k // 64].float()) * scales[n, k // 64].float()
    assert dequantize_int4(qweight, scales, zeros, 64)[n, k] == expected
    err = (dequantize_int4(qweight, scales, zeros, 64) - w).abs()
    assert (err <= scales.float().repeat_interleave(64, 1) / 2 + 1e-6).all()  # round to nearest


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_hub_layout_round_trips(bits, act_order):
    lin = torch.nn.Linear(256, 64, bias=True)
    mod = Int4Linear.from_float(lin, 64, bits)
    if act_order:  # a permuted module: g_idx on disk is then not monotone
        perm = torch.randperm(256, generator=torch.Generator().manual_seed(0))
        mod.perm = perm.to(torch.int32)
    for sym in (False, True):
        if sym:
            mod.zeros.fill_(2 ** (bits - 1))
        t = hub.to_gptq(mod, sym)
        assert t["qweight"].dtype == torch.int32 and t["qweight"].shape == (256 * bits // 32, 64)
        assert t["qzeros"].shape == (4, 64 * bits // 32) and t["scales"].shape == (4, 64)
        back = hub.from_gptq({**t, "bias": lin.bias}, bits, 64, act_order, v1=sym)
        new = Int4Linear(256, 64, True, 64, bits, act_order=act_order)
        new.load_state_dict(back)
        assert torch.equal(new.dequantize_original_order(), mod.dequantize_original_order())


def test_gptq_v1_sym_4bit_zero_words():
    """AutoGPTQ's v1 layout stores zero - 1: a symmetric 4-bit zero of 8 is the word 0x77777777."""
    mod = Int4Linear.from_float(torch.nn.Linear(128, 32), 128, 4, sym=True)
    assert (hub.to_gptq(mod, sym=True)["qzeros"] == 0x77777777).all()


def test_awq_hub_layout_round_trips_and_interleaves():
    mod = Int4Linear.from_float(torch.nn.Linear(256, 64), 128, 4)
    t = hub.to_awq(mod)
    assert t["qweight"].shape == (256, 8) and t["qzeros"].shape == (2, 8)
    q = unpack_int4(mod.qweight)
    word = int(t["qweight"][0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == [int(q[c, 0]) for c in hub.AWQ_ORDER]
    back = hub.from_awq(t)
    assert torch.equal(back["qweight"], mod.qweight) and torch.equal(back["zeros"], mod.zeros)


# --- llama.cpp's blocks, against gguf (llama.cpp's own Python package) ---

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize  # noqa: E402

TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
         "q4_1": gguf.GGMLQuantizationType.Q4_1, "q4_k": gguf.GGMLQuantizationType.Q4_K}


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1"])
def test_ggml_bytes_equal_gguf_quantize(name):
    w = weights()
    w[0, :32], w[1, 32:64], w[2, 64:96] = 0.0, 0.25, -0.3  # flat blocks: a zero or a single-valued range
    ours = ggml.QUANTIZE[name](w).numpy()
    assert np.array_equal(ours, gguf_quantize(w.numpy(), TYPES[name]))


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q4_k"])
def test_gguf_dequantize_of_our_bytes_equals_ours(name):
    w = weights()
    blocks = ggml.QUANTIZE[name](w)
    size, nbytes = ggml.BLOCKS[name]
    assert blocks.shape == (48, 512 // size * nbytes)
    ref = gguf_dequantize(blocks.numpy(), TYPES[name])
    assert np.array_equal(ggml.DEQUANTIZE[name](blocks).view(48, 512).numpy(), ref)
    assert np.abs(ref - w.numpy()).mean() < {"q8_0": 1e-3, "q4_0": 6e-3, "q4_1": 6e-3, "q4_k": 6e-3}[name]


def test_q4_k_searched_scales_beat_q4_0():
    """Q4_K's per-sub-block scale and min (searched) fit better than Q4_0's absmax at the same 4.5 bits."""
    w = weights(64, 1024, seed=1)
    err = {n: (ggml.DEQUANTIZE[n](ggml.QUANTIZE[n](w)).view_as(w) - w).pow(2).mean() for n in ("q4_0", "q4_k")}
    assert err["q4_k"] < err["q4_0"]


def test_q4_1_min_fits_one_signed_blocks_better_than_q4_0():
    """Q4_0's grid is symmetric about 0, so a block of positive weights uses about half its 16 codes;
    Q4_1's runs from the block's min to its max and uses all 16 (for 0.5 bit more per weight)."""
    w = weights(64, 1024, seed=2).abs() + 0.02
    err = {n: (ggml.DEQUANTIZE[n](ggml.QUANTIZE[n](w)).view_as(w) - w).pow(2).mean() for n in ("q4_0", "q4_1")}
    assert err["q4_1"] < err["q4_0"] / 2


# --- NF4 against bitsandbytes ---

def test_nf4_dequantize_equals_bitsandbytes():
    bnb_f = pytest.importorskip("bitsandbytes.functional")
    w = weights(32, 256)
    packed, absmax = quantize_nf4(w, 64)
    state = bnb_f.QuantState(absmax=absmax, shape=w.shape, code=bnb_f.get_4bit_type("nf4", device="cpu"),
                             blocksize=64, quant_type="nf4", dtype=torch.float32)
    ref = bnb_f.dequantize_4bit(packed.view(-1, 1), state, quant_type="nf4")
    assert torch.equal(dequantize_nf4(packed, absmax, w.shape, 64), ref)
    q_ref, _ = bnb_f.quantize_4bit(w, blocksize=64, quant_type="nf4")  # and bnb picks the same codes
    assert torch.equal(packed, q_ref.view(-1))


def test_int4_weight_bytes_under_0_3x_fp16():
    mod = Int4Linear.from_float(torch.nn.Linear(768, 256), 128)
    assert mod.weight_bytes() <= 0.3 * 768 * 256 * 2
    assert NF4Linear.from_float(torch.nn.Linear(768, 256)).bits_per_weight == 4.5
