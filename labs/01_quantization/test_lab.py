"""Graded tests for lab 01. `inferlab grade labs/01_quantization` runs them against starter.py;
with --reference they run against inferlab.quant (int4 and gptq), the reference solution."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab import labkit
from inferlab.quant import gptq as ref_gptq
from inferlab.quant import int4 as ref_int4

rtn = labkit.implementation(__file__, reference="inferlab.quant.int4", functions=[
    "pack_int4", "unpack_int4", "group_qparams", "quantize_int4", "dequantize_int4"])
gptq = labkit.implementation(__file__, reference="inferlab.quant.gptq", functions=[
    "hessian_inverse_cholesky", "gptq_inner_loop"])


def weights(out=16, cols=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=g) * 0.05
    w[1, 3] = 0.8  # an outlier: only its own group should suffer
    return w


def layer(seed=0, out=32, cols=128, tokens=512):
    """A weight and correlated inputs with a few loud channels, like a real layer's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, cols, generator=g) @ (torch.eye(cols) + 0.3 * torch.randn(cols, cols, generator=g))
    x[:, :4] *= 8
    return torch.randn(out, cols, generator=g) * 0.05, x


def same(a, b):
    return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


@labkit.points(2)
def test_pack_puts_the_even_column_in_the_low_nibble():
    q = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 12]], dtype=torch.uint8)
    got = rtn.pack_int4(q)
    labkit.expect(same(got.to(torch.uint8), torch.tensor([[0x21, 0x0F], [0x87, 0xC3]], dtype=torch.uint8)),
                  "pack_int4: byte [n, j] must be q[n, 2j] | q[n, 2j + 1] << 4", q=q.tolist(), got=got.tolist())


@labkit.points(1)
@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 10_000))
def test_unpack_inverts_pack(rows, half, seed):
    q = torch.randint(0, 16, (rows, 2 * half), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    labkit.expect(same(rtn.unpack_int4(rtn.pack_int4(q)).to(torch.uint8), q), "unpack_int4(pack_int4(q)) != q",
                  shape=tuple(q.shape))


@labkit.points(2)
def test_group_qparams_min_max():
    w = torch.tensor([[-1.0, 0.5, 2.0, 0.0], [0.2, 0.4, 0.6, 0.8]])
    scale, zero = rtn.group_qparams(w, 4)
    labkit.expect(torch.allclose(scale.float(), torch.tensor([3.0 / 15, 0.8 / 15])),
                  "scale = (max(w.max, 0) - min(w.min, 0)) / 15", got=scale.tolist())
    labkit.expect(torch.equal(zero.float(), torch.tensor([5.0, 0.0])), "zero = round(-lo / scale)", got=zero.tolist())


@labkit.points(3)
def test_quantize_int4_matches_the_reference():
    for group, bits in ((128, 4), (64, 4), (32, 3)):
        w = weights(seed=group)
        got = rtn.quantize_int4(w, group, bits)
        exp = ref_int4.quantize_int4(w, group, bits)
        for name, a, b in zip(("qweight", "scales", "zeros"), got, exp):
            labkit.expect(same(a, b), f"quantize_int4(w, {group}, {bits}): {name} differs from the reference "
                          f"(shape {tuple(b.shape)}, dtype {b.dtype})", got_shape=tuple(a.shape), got_dtype=str(a.dtype))


@labkit.points(2)
def test_dequantize_int4_and_the_error_bound():
    w = weights(seed=7)
    qw, s, z = ref_int4.quantize_int4(w, 64)
    got = rtn.dequantize_int4(qw, s, z, 64)
    labkit.expect(torch.allclose(got.float(), ref_int4.dequantize_int4(qw, s, z, 64)),
                  "dequantize_int4 must give (q - zeros[group]) * scales[group]")
    half_step = s.float().repeat_interleave(64, 1) / 2 + 1e-6
    labkit.expect(bool(((got.float() - w).abs() <= half_step).all()), "round-to-nearest: |w - w~| <= scale / 2")


@labkit.points(1)
def test_groups_contain_the_outlier():
    w = weights()
    err32 = (rtn.dequantize_int4(*rtn.quantize_int4(w, 32), 32) - w).pow(2).mean().item()
    err128 = (rtn.dequantize_int4(*rtn.quantize_int4(w, 128), 128) - w).pow(2).mean().item()
    labkit.expect(err32 < err128, "smaller groups must fit better (the outlier spoils fewer weights)",
                  err32=err32, err128=err128)


@labkit.points(2)
def test_hessian_inverse_cholesky():
    w, x = layer()
    H = 2 * x.T @ x / len(x)
    got = gptq.hessian_inverse_cholesky(H, 0.01)
    labkit.expect(torch.allclose(got, ref_gptq.hessian_inverse_cholesky(H, 0.01), rtol=1e-3, atol=1e-5),
                  "the upper Cholesky factor of (H + 0.01 * mean(diag H) * I)^-1")


@labkit.points(4)
def test_gptq_inner_loop_matches_the_reference_and_beats_rtn():
    for bits, group in ((4, 32), (3, 64)):
        w, x = layer(seed=bits)
        Hinv = ref_gptq.hessian_inverse_cholesky(2 * x.T @ x / len(x))
        q, s, z = gptq.gptq_inner_loop(w, Hinv, bits, group)
        rq, rs, rz = ref_gptq.gptq_inner_loop(w, Hinv, bits, group)
        agree = (q.to(torch.uint8) == rq).float().mean().item()
        labkit.expect(agree > 0.99, f"gptq_inner_loop({bits}-bit, group {group}): codes differ from the reference",
                      fraction_equal=agree)

        def out_err(codes, scales, zeros):
            w_hat = ref_int4.dequantize_int4(ref_int4.pack_int4(codes.to(torch.uint8)), scales, zeros, group)
            return (x @ (w - w_hat).T).pow(2).mean().item()

        err, ref_err = out_err(q, s, z), out_err(rq, rs, rz)
        rtn_err = (x @ (w - ref_int4.dequantize_int4(*ref_int4.quantize_int4(w, group, bits), group)).T).pow(2).mean().item()
        labkit.expect(err <= 1.01 * ref_err and err < rtn_err, "GPTQ's output error must match the reference's "
                      "and be below round-to-nearest's", gptq_error=err, reference_error=ref_err, rtn_error=rtn_err)
