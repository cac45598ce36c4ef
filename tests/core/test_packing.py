"""Packed projections (q/k/v and gate/up as one GEMM each): the same logits as the model they were
packed from, no weight stored twice, a replaced projection never served from a stale packed copy,
and a packed model saves and reloads through safetensors."""
import copy

import pytest
import torch

from inferlab.model.loader import load_checkpoint, save_checkpoint
from inferlab.model.packing import pack_projections
from inferlab.quant import quantize_model


@pytest.fixture(scope="module")
def target():
    return load_checkpoint("target", device="cpu", dtype=torch.float32)


def logits(model, ids):
    with torch.inference_mode():
        return model(ids)


IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 1000, 12]])


@pytest.mark.parametrize("method", [None, "int8", "int4", "q4_k", "nf4"])
def test_packed_equals_unpacked(target, method):
    model = copy.deepcopy(target[0])
    if method:
        quantize_model(model, method, progress=False)
    ref = logits(model, IDS)
    ref_decode = logits(model, IDS[:, :1])  # one row: the fused decode paths of the quantized formats
    assert pack_projections(model) == 2 * model.config.num_hidden_layers
    assert model.model.layers[0].self_attn.__dict__["packed_qkv"] is not None
    torch.testing.assert_close(logits(model, IDS), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits(model, IDS[:, :1]), ref_decode, atol=1e-4, rtol=1e-4)


def test_no_weight_is_stored_twice(target):
    model = copy.deepcopy(target[0])
    def stored(m):  # bytes of the distinct storages behind the state dict (a tied weight once)
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in m.state_dict().values()}.values())
    before = stored(model)
    pack_projections(model)
    attn = model.model.layers[0].self_attn
    full = attn.packed_qkv.fused.weight
    assert attn.q_proj.weight.data_ptr() == full.data_ptr()
    assert attn.v_proj.weight.data_ptr() == full.data_ptr() + (attn.q_proj.out_features + attn.k_proj.out_features) \
        * full.shape[1] * full.element_size()
    assert stored(model) == before


def test_a_replaced_projection_is_never_served_stale(target):
    model = copy.deepcopy(target[0])
    pack_projections(model)
    quantize_model(model, "int4", progress=False)  # replaces every projection after packing
    fresh = copy.deepcopy(target[0])
    quantize_model(fresh, "int4", progress=False)
    torch.testing.assert_close(logits(model, IDS), logits(fresh, IDS), atol=1e-5, rtol=1e-5)
    assert model.model.layers[0].self_attn.__dict__["packed_qkv"] is None  # the stale copy is freed


def test_weights_changed_in_place_are_seen(target):
    model = copy.deepcopy(target[0])
    pack_projections(model)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(0.5)
    fresh = copy.deepcopy(target[0])
    with torch.no_grad():
        fresh.model.layers[0].self_attn.k_proj.weight.mul_(0.5)
    torch.testing.assert_close(logits(model, IDS), logits(fresh, IDS), atol=1e-5, rtol=1e-5)


def test_a_packed_model_saves_and_reloads(target, tmp_path):
    model = copy.deepcopy(target[0])
    pack_projections(model)
    save_checkpoint(model, target[1], tmp_path / "m")
    again, _ = load_checkpoint(str(tmp_path / "m"), device="cpu", dtype=torch.float32)
    torch.testing.assert_close(logits(again, IDS), logits(target[0], IDS), atol=1e-5, rtol=1e-5)


def test_nf4_packs_its_flat_buffers_by_row(target):
    """NF4 keeps codes and absmax flat (bitsandbytes' layout); with blocks inside rows, each part's
    are a contiguous run of the packed ones, in the order the parts are stacked."""
    model = copy.deepcopy(target[0])
    quantize_model(model, "nf4", progress=False)
    attn = model.model.layers[0].self_attn
    before = [(p.qweight.clone(), p.absmax.clone()) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    pack_projections(model)
    fused = attn.packed_qkv.fused
    assert fused.qweight.dim() == fused.absmax.dim() == 1
    torch.testing.assert_close(fused.qweight, torch.cat([q for q, _ in before]))
    torch.testing.assert_close(fused.absmax, torch.cat([a for _, a in before]))
    assert attn.k_proj.qweight.data_ptr() == fused.qweight.data_ptr() + before[0][0].numel()


def test_formats_that_cannot_pack_stay_unpacked(target):
    """NF4 blocks that straddle two rows (a block longer than the input width) are not a stack of rows."""
    model = copy.deepcopy(target[0])
    quantize_model(model, "nf4", group_size=2 * model.config.hidden_size, progress=False)
    ref = logits(model, IDS)
    assert pack_projections(model) == 0
    torch.testing.assert_close(logits(model, IDS), ref)


def test_a_hooked_projection_sees_its_input(target):
    """Calibration (GPTQ, AWQ) and notebook probes hook single projections: packing must not hide them."""
    model = copy.deepcopy(target[0])
    pack_projections(model)
    seen = []
    handle = model.model.layers[1].self_attn.k_proj.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    ref = logits(model, IDS)
    handle.remove()
    assert seen == [torch.Size([1, IDS.shape[1], model.config.num_key_value_heads * model.config.head_dim])]
    torch.testing.assert_close(logits(model, IDS), ref, atol=1e-5, rtol=1e-5)
