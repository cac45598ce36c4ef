"""FlashAttention forward against torch's own scaled_dot_product_attention."""
import pytest
import torch
import torch.nn.functional as F

from inferlab.kernels.flash_attention import attention_reference, flash_attention
from tests.kernels.conftest import DEVICE, tol


def sdpa(q, k, v, causal, scale=None):
    """torch's SDPA in fp32, with the bottom-right causal mask spelled out (its is_causal is top-left)."""
    tq, tk = q.shape[2], k.shape[2]
    mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq) if causal else None
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def rand(*shape, dtype):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


CASES = [  # B, Hq, Hkv, Tq, Tk, D, causal
    (1, 1, 1, 1, 1, 16, True),      # length 1
    (2, 4, 1, 7, 33, 32, True),     # MQA, queries at the end of a longer context
    (1, 8, 2, 37, 37, 64, True),    # GQA 4:1, not a multiple of the tile
    (1, 4, 4, 45, 20, 16, False),   # more queries than keys, no mask
    (2, 2, 2, 33, 65, 32, False),
    (1, 2, 1, 3, 70, 128, True),
]


@pytest.mark.parametrize("b,hq,hkv,tq,tk,d,causal", CASES)
def test_matches_sdpa(b, hq, hkv, tq, tk, d, causal, dtype):
    q, k, v = rand(b, hq, tq, d, dtype=dtype), rand(b, hkv, tk, d, dtype=dtype), rand(b, hkv, tk, d, dtype=dtype)
    out = flash_attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), sdpa(q, k, v, causal), atol=tol(dtype), rtol=tol(dtype))
    torch.testing.assert_close(out.float(), attention_reference(q, k, v, causal).float(), atol=tol(dtype), rtol=tol(dtype))


def test_scale_and_strided_inputs(dtype):
    # [B, T, H, D] transposed to [B, H, T, D], as a model's projections produce them
    q = rand(2, 21, 4, 32, dtype=dtype).transpose(1, 2)
    k = rand(2, 40, 2, 32, dtype=dtype).transpose(1, 2)
    v = rand(2, 40, 2, 32, dtype=dtype).transpose(1, 2)
    out = flash_attention(q, k, v, causal=True, sm_scale=0.3)
    torch.testing.assert_close(out.float(), sdpa(q, k, v, True, scale=0.3), atol=tol(dtype), rtol=tol(dtype))


def test_large_scores_stay_finite():
    # scores ~ 1e3: a softmax without the running max would overflow exp()
    q = rand(1, 2, 19, 16, dtype=torch.float32 if DEVICE == "cpu" else torch.float16) * 30
    k = rand(1, 2, 50, 16, dtype=q.dtype) * 30
    v = rand(1, 2, 50, 16, dtype=q.dtype)
    out = flash_attention(q, k, v, causal=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), sdpa(q, k, v, True), atol=tol(q.dtype) * 10, rtol=tol(q.dtype) * 10)


@pytest.mark.parametrize("shapes,causal,message", [
    (((1, 2, 5, 16), (1, 2, 3, 16)), True, "Tq <= Tk"),
    (((1, 3, 4, 16), (1, 2, 4, 16)), True, "multiple of key/value heads"),
    (((1, 2, 4, 24), (1, 2, 4, 24)), True, "head_dim 24 is not supported"),
    (((2, 4, 16), (2, 4, 4, 16)), True, r"q \[B, Hq, Tq, D\]"),
])
def test_bad_inputs_are_clear_errors(shapes, causal, message):
    q, k = torch.randn(*shapes[0], device=DEVICE), torch.randn(*shapes[1], device=DEVICE)
    with pytest.raises(ValueError, match=message):
        flash_attention(q, k, k.clone(), causal=causal)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's dtype limit")
def test_half_precision_on_cpu_says_what_to_do():
    q = torch.randn(1, 1, 4, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"float32 inputs.*\.float\(\)"):
        flash_attention(q, q, q)
