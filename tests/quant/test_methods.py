"""GPTQ and AWQ do what their papers claim on one layer of the embedded model; bad requests fail clearly."""
import pytest
import torch

from inferlab.model.loader import load_checkpoint
from inferlab.quant import QuantizationError, awq, calibration, quantize_model
from inferlab.quant.gptq import HessianAccumulator, gptq_quantize
from inferlab.quant.int4 import dequantize_int4, pack_int4, quantize_int4
from inferlab.quant.methods import resolve

from .helpers import tiny_model, tokens


@pytest.fixture(scope="module")
def layer_inputs():
    """Inputs of layer 1's up_proj and down_proj on a few train-split windows, with the weights."""
    model, tok = load_checkpoint("target", device="cpu", dtype=torch.float32)
    calib = calibration.calibration_tokens(tok, n_samples=4, seq_len=128, seed=1)
    layer = model.model.layers[1]
    mods = {"mlp.up_proj": layer.mlp.up_proj, "mlp.down_proj": layer.mlp.down_proj}
    xs = {n: [] for n in mods}
    handles = calibration.capture_inputs(mods, lambda n, x: xs[n].append(x))
    calibration.run_through_layer(model, calib, 1)
    for h in handles:
        h.remove()
    return {n: (m.weight.detach().clone(), torch.cat(xs[n])) for n, m in mods.items()}, layer


def test_carried_layer_inputs_are_what_a_full_forward_feeds_the_layer():
    """The quantizers' layer-by-layer inputs equal those of re-running the model to the layer, after
    an earlier layer changed (as quantizing it does)."""
    model, tok = load_checkpoint("target", device="cpu", dtype=torch.float32)
    calib = calibration.calibration_tokens(tok, n_samples=3, seq_len=64, seed=2)
    inputs = calibration.LayerInputs(model, calib, batch_size=2)

    def captured(run):
        seen = []
        handles = calibration.capture_inputs({"q": model.model.layers[1].self_attn.q_proj}, lambda n, x: seen.append(x))
        run()
        for h in handles:
            h.remove()
        return torch.cat(seen)

    inputs.run()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # layer 0 changes after its capture
    inputs.run(keep=True)
    torch.testing.assert_close(captured(inputs.run), captured(lambda: calibration.run_through_layer(model, calib, 1)),
                               rtol=0, atol=1e-6)


def output_error(w, w_hat, x):
    return (x @ (w - w_hat).T).pow(2).mean().item()


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_layer_error_below_rtn(layer_inputs, bits, act_order):
    for name, (w, x) in layer_inputs[0].items():
        acc = HessianAccumulator(w.shape[1])
        acc.add(x)
        torch.testing.assert_close(acc.H, 2 * x.T @ x / len(x), rtol=1e-4, atol=1e-4)
        q, scales, zeros, perm = gptq_quantize(w, acc.H, bits, 128, act_order)
        w_gptq = dequantize_int4(pack_int4(q), scales, zeros, 128)
        if perm is not None:
            w_gptq = w_gptq[:, torch.argsort(perm)]
        rtn_w = dequantize_int4(*quantize_int4(w, 128, bits), 128)
        e_gptq, e_rtn = output_error(w, w_gptq, x), output_error(w, rtn_w, x)
        assert e_gptq < 0.9 * e_rtn, f"{name} {bits}-bit: GPTQ {e_gptq:.3g} vs RTN {e_rtn:.3g}"


def test_awq_scales_lower_the_layer_output_error(layer_inputs):
    (w_up, x_up), (w_down, x_down) = layer_inputs[0]["mlp.up_proj"], layer_inputs[0]["mlp.down_proj"]
    for w, x in ((w_up, x_up), (w_down, x_down)):
        s, alpha, losses = awq.search_scale(x, x.abs().mean(0), [w], bits=3, group_size=128)
        assert losses[0] == pytest.approx(output_error(w, awq.fake_quant(w, 3, 128), x), rel=1e-4)  # alpha 0 = RTN
        assert alpha > 0 and min(losses) < losses[0]
        w_awq = awq.fake_quant(w * s, 3, 128) / s
        assert output_error(w, w_awq, x) < output_error(w, awq.fake_quant(w, 3, 128), x)
        clipped = awq.search_clip(w * s, x / s, 3, 128)
        assert output_error(w, awq.fake_quant(clipped, 3, 128) / s, x) <= output_error(w, w_awq, x) * 1.0001


def test_awq_folding_keeps_the_function():
    """W diag(s) with the input divided by s (folded into the norm / the previous linear) changes nothing."""
    model = tiny_model()
    x = tokens(2, 16)
    with torch.no_grad():
        before = model(x)
        layer = model.model.layers[0]
        for prev, names in awq.scale_groups(layer):
            mods = [layer.get_submodule(n) for n in names]
            awq.apply_scale(prev, mods, torch.rand(mods[0].in_features) + 0.5)
        torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("args,message", [
    (("fp3",), "unknown quantization method 'fp3'"),
    (("int4", 5), "int4 supports --bits 2 or 3 or 4, not 5"),
    (("int8", 4), "int8 supports --bits 8, not 4"),
    (("awq", 2), "awq supports --bits 3 or 4"),
    (("q4_k", None, 64), "q4_k blocks hold 256 values"),
    (("int8", None, 64), "int8 has one scale per output channel"),
])
def test_bad_requests_are_one_line_errors(args, message):
    with pytest.raises(QuantizationError, match=message) as info:
        resolve(*args)
    assert "\n" not in str(info.value)


def test_group_size_must_divide_the_input_dimension():
    model = tiny_model()
    with pytest.raises(QuantizationError, match="group size 96 does not divide the input dimension 256") as info:
        quantize_model(model, "int4", 4, 96, progress=False)
    assert "\n" not in str(info.value)
    quantize_model(model, "int8", progress=False)
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_model(model, "int4", progress=False)
