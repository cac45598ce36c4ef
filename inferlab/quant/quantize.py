"""``quantize_model``: replace a loaded model's linears (all but lm_head) by quantized ones, in place.

Round-to-nearest methods (int8, int4, nf4, q8_0, q4_0, q4_1, q4_k) look only at the weights. GPTQ and AWQ
also look at calibration activations from the corpus' train split, one decoder layer at a time.
Returns the ``quantization_config`` that config.json stores, so the folder loads back.
"""
from __future__ import annotations

import torch
from torch import nn

from inferlab.model.linear import replace_linears
from inferlab.quant import awq, calibration
from inferlab.quant.base import QuantizationError, QuantLinear
from inferlab.quant.ggml import BLOCKS, GGMLLinear
from inferlab.quant.gptq import HessianAccumulator, gptq_linear
from inferlab.quant.int4 import Int4Linear
from inferlab.quant.int8 import Int8Linear
from inferlab.quant.methods import METHODS, check_model, resolve
from inferlab.quant.nf4 import NF4Linear


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, unit="layer")


def quantization_config(method: str, bits: int, group_size: int | None, act_order: bool = False,
                        sym: bool = False, modules: dict[str, dict] | None = None) -> dict:
    """The ``quantization_config`` entry of config.json (hub field names for GPTQ and AWQ).
    ``modules`` holds the tensors stored otherwise than the method's default: a smaller group or
    another block type where the default does not divide the width, and a quantized ``lm_head``."""
    if method == "gptq":
        cfg = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": act_order,
               "sym": sym, "damp_percent": 0.01, "true_sequential": False, "lm_head": False,
               "checkpoint_format": "gptq" if sym else "gptq_v2"}
    elif method == "awq":
        cfg = {"quant_method": "awq", "bits": bits, "group_size": group_size, "zero_point": True,
               "version": "gemm"}
    else:
        cfg = {"quant_method": method, "bits": bits}
        if group_size is not None:
            cfg["group_size" if method == "int4" else "block_size"] = group_size
    if modules:
        cfg["modules"] = dict(sorted(modules.items()))
    return cfg


def head_format(method: str) -> dict:
    """The format of a quantized output head: llama.cpp keeps its token embedding / output in Q8_0
    (or better) under every 4-bit type, since the head's errors land straight on the logits; here
    Q8_0 for the llama.cpp methods, INT8 per output channel for the others."""
    return {"quant_method": "q8_0" if method in BLOCKS else "int8"}


def quantize_output_head(model, method: str) -> dict:
    """Replace ``model.lm_head`` by its quantized form for a model quantized with ``method``;
    returns the head's entry of ``quantization_config["modules"]``."""
    fmt = head_format(method)
    model.lm_head = build_linear(model.lm_head, method, None, None, fmt)
    return fmt


def build_linear(lin: nn.Linear, method: str, bits: int, group_size: int | None, fmt: dict) -> QuantLinear:
    """One round-to-nearest linear under ``method``, or under its per-tensor override ``fmt``."""
    method = fmt.get("quant_method", method)
    group_size = fmt.get("group_size", group_size)
    if method == "int8":
        return Int8Linear.from_float(lin)
    if method in ("int4", "gptq", "awq"):
        return Int4Linear.from_float(lin, group_size if group_size not in (-1, None) else lin.in_features, bits)
    if method == "nf4":
        return NF4Linear.from_float(lin, group_size)
    return GGMLLinear.from_float(lin, method)


@torch.no_grad()
def quantize_model(model, method: str, bits: int | None = None, group_size: int | None = None, *,
                   tokenizer=None, calibration_tokens: torch.Tensor | None = None, n_samples: int = 64,
                   seq_len: int = 512, act_order: bool = True, sym: bool = False,
                   quantize_head: bool = False, progress: bool = True) -> dict:
    """Quantize ``model`` in place with ``method``; returns its quantization_config.

    ``quantize_head`` also stores the output head quantized (:func:`head_format`). With tied
    embeddings the input lookup keeps its float table: it reads one row per token, the head all of it."""
    method, bits, group_size = resolve(method, bits, group_size)
    if quantized_modules(model):
        raise QuantizationError("this model is already quantized: load the unquantized model to quantize it")
    modules = check_model(model, method, group_size)
    if method == "awq" and group_size == -1:
        group_size = None
    if METHODS[method].calibrated:
        if calibration_tokens is None:
            if tokenizer is None:
                raise ValueError(f"{method} needs calibration data: pass a tokenizer or calibration_tokens")
            seq_len = min(seq_len, model.config.max_position_embeddings)
            calibration_tokens = calibration.calibration_tokens(tokenizer, n_samples, seq_len)
        group_of = (lambda name, lin: modules.get(name, {}).get("group_size", group_size or lin.in_features))
        if method == "gptq":
            _gptq(model, calibration_tokens, bits, group_of, act_order, sym, progress)
        else:
            _awq(model, calibration_tokens, bits, group_of, progress)
    else:
        replace_linears(model, lambda name, lin: build_linear(lin, method, bits, group_size, modules.get(name, {})))
    if quantize_head:
        modules["lm_head"] = quantize_output_head(model, method)
    return quantization_config(method, bits, group_size, act_order and method == "gptq", sym, modules)


def _layer_name(i: int, name: str) -> str:
    return f"model.layers.{i}.{name}"


def _gptq(model, tokens, bits, group_of, act_order, sym, progress) -> None:
    inputs = calibration.LayerInputs(model, tokens)
    for i in _progress(range(len(model.model.layers)), progress, f"GPTQ {bits}-bit"):
        layer = model.model.layers[i]
        linears = calibration.layer_linears(layer)
        hessians = {n: HessianAccumulator(m.in_features, m.weight.device) for n, m in linears.items()}
        handles = calibration.capture_inputs(linears, lambda n, x: hessians[n].add(x))
        try:
            inputs.run()
        finally:
            for h in handles:
                h.remove()
        for name, lin in linears.items():
            group = group_of(_layer_name(i, name), lin)
            new = gptq_linear(lin, hessians[name].H, bits, -1 if group == lin.in_features else group, act_order, sym)
            parent, _, child = name.rpartition(".")
            setattr(layer.get_submodule(parent), child, new)
        inputs.run(keep=True)  # the next layer's inputs, through this layer as quantized


def _awq(model, tokens, bits, group_of, progress, max_rows: int = 2048, clip_rows: int = 512) -> None:
    inputs = calibration.LayerInputs(model, tokens)
    for i in _progress(range(len(model.model.layers)), progress, f"AWQ {bits}-bit"):
        layer = model.model.layers[i]
        linears = calibration.layer_linears(layer)
        samples: dict[str, list] = {n: [] for n in linears}
        abs_sum = {n: 0.0 for n in linears}
        count = {n: 0 for n in linears}
        step = max(1, len(tokens) * tokens.shape[1] // max_rows)

        def record(name, x):
            abs_sum[name] = abs_sum[name] + x.abs().sum(0)
            count[name] += x.shape[0]
            samples[name].append(x[::step])

        handles = calibration.capture_inputs(linears, record)
        try:
            inputs.run()
        finally:
            for h in handles:
                h.remove()
        x = {n: torch.cat(samples[n])[:max_rows] for n in linears}
        for prev, names in awq.scale_groups(layer):
            first = names[0]
            mods = [layer.get_submodule(n) for n in names]
            s, _, _ = awq.search_scale(x[first], abs_sum[first] / count[first], [m.weight for m in mods],
                                       bits, group_of(_layer_name(i, first), mods[0]))
            awq.apply_scale(prev, mods, s)
            for n in names:
                x[n] = x[n] / s
        for name, lin in linears.items():
            if name.endswith(("q_proj", "k_proj")):  # AutoAWQ leaves q/k unclipped (attention scores are sensitive)
                continue
            rows = x[name][::max(1, len(x[name]) // clip_rows)][:clip_rows]  # 512 tokens, as AutoAWQ clips on
            lin.weight.copy_(awq.search_clip(lin.weight, rows, bits, group_of(_layer_name(i, name), lin)))
        inputs.run(keep=True)  # the next layer's inputs, through this layer as scaled and clipped
    replace_linears(model, lambda name, lin: Int4Linear.from_float(lin, group_of(name, lin), bits))


def quantized_modules(model) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def linear_weight_bytes(model) -> tuple[int, int]:
    """(bytes of the linear weights as stored, number of those weights), lm_head excluded."""
    total, count = 0, 0
    for name, m in model.named_modules():
        if name == "lm_head":
            continue
        if isinstance(m, QuantLinear):
            total += m.weight_bytes()
            count += m.in_features * m.out_features
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
            count += m.weight.numel()
    return total, count


def quantize_like_target(draft: nn.Module, target) -> nn.Module:
    """A target run from quantized weights (smollm2 as stored: Q4_1 layers, a Q8_0 head) reads
    about 97 MB a token, so an fp32 draft of 26 MB would cost c ~ 0.27; its linears in Q8_0
    (``inferlab.quant.ggml``, the same decode loops) read a quarter of that. An fp32 target keeps
    an fp32 draft. Any proposer's module (EAGLE's layer, a cut draft, Medusa's blocks). In place;
    returns ``draft``."""
    if is_quantized(target):
        replace_linears(draft, lambda name, lin: GGMLLinear.from_float(lin, "q8_0"), skip=lambda name: False)
    return draft


def is_quantized(target) -> bool:
    """Does ``target`` read any of its linears from quantized weights?"""
    return any(isinstance(m, QuantLinear) for m in target.modules())
