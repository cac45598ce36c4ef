"""Quantized folders: write them, and let the loader build the matching linears when reading one.

A quantized folder is an ordinary HF folder whose config.json carries a ``quantization_config``
(``quant_method``, ``bits``, ``group_size`` ...). The loader asks :func:`linear_factory` for the
modules to build and :func:`convert_checkpoint` to turn the stored tensors into their buffers.
GPTQ and AWQ folders use the hub layouts (see :mod:`inferlab.quant.hub`), so checkpoints made by
AutoGPTQ / GPTQModel / AutoAWQ for a Llama or Qwen2 model load too; the other methods store the
modules' own buffers (``qweight``, ``scales``, ``zeros`` / ``absmax``) under each linear's name.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from inferlab.errors import CheckpointError
from inferlab.quant import hub
from inferlab.quant.base import QuantLinear
from inferlab.quant.ggml import GGMLLinear
from inferlab.quant.int4 import Int4Linear
from inferlab.quant.int8 import Int8Linear
from inferlab.quant.methods import METHODS
from inferlab.quant.nf4 import NF4Linear

HUB_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx", "bias")


def read_quantization_config(folder: Path) -> dict | None:
    """config.json's ``quantization_config`` (or an older AutoGPTQ ``quantize_config.json``), or None."""
    raw = json.loads((Path(folder) / "config.json").read_text())
    qcfg = raw.get("quantization_config")
    if qcfg is None and (Path(folder) / "quantize_config.json").exists():
        qcfg = {"quant_method": "gptq", **json.loads((Path(folder) / "quantize_config.json").read_text())}
    if qcfg is None:
        return None
    method = qcfg.get("quant_method")
    if method not in METHODS:
        raise CheckpointError(f"{folder}: quantization method {method!r} is not supported: inferlab loads "
                              f"{', '.join(METHODS)}")
    if method == "awq" and str(qcfg.get("version", "gemm")).lower() != "gemm":
        raise CheckpointError(f"{folder}: AWQ version {qcfg.get('version')!r} is not supported: only the GEMM layout")
    if method in ("gptq", "awq") and qcfg.get("bits") not in METHODS[method].bits:
        raise CheckpointError(f"{folder}: {method} with {qcfg.get('bits')} bits is not supported")
    return qcfg


def linear_factory(qcfg: dict, skip=("lm_head",)):
    """The linear factory that builds, for every projection but ``skip``, the method's module."""
    method, bits = qcfg["quant_method"], int(qcfg.get("bits", METHODS[qcfg["quant_method"]].default_bits))

    def build(in_features: int, out_features: int, bias: bool, name: str) -> nn.Module:
        if name in skip:
            return nn.Linear(in_features, out_features, bias=bias)
        group = qcfg.get("group_size", qcfg.get("block_size"))
        group = in_features if group in (-1, None) else group
        if method == "int8":
            return Int8Linear(in_features, out_features, bias)
        if method in ("int4", "gptq", "awq"):
            return Int4Linear(in_features, out_features, bias, group, bits,
                              act_order=method == "gptq" and bool(qcfg.get("desc_act")))
        if method == "nf4":
            return NF4Linear(in_features, out_features, bias, group)
        return GGMLLinear(in_features, out_features, bias, method)
    return build


def convert_checkpoint(qcfg: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hub GPTQ/AWQ tensors -> Int4Linear buffers; other methods are stored as the modules hold them."""
    method = qcfg["quant_method"]
    if method not in ("gptq", "awq"):
        return tensors
    prefixes = {k.rsplit(".", 1)[0] for k in tensors if k.endswith(".qweight")}
    out = {k: v for k, v in tensors.items()
           if not (k.rsplit(".", 1)[0] in prefixes and k.rsplit(".", 1)[1] in HUB_SUFFIXES)}
    for p in sorted(prefixes):
        part = {s: tensors[f"{p}.{s}"] for s in HUB_SUFFIXES if f"{p}.{s}" in tensors}
        if method == "gptq":
            conv = hub.from_gptq(part, int(qcfg["bits"]), int(qcfg["group_size"]), bool(qcfg.get("desc_act")),
                                 v1=qcfg.get("checkpoint_format", "gptq") == "gptq")
        else:
            conv = hub.from_awq(part)
        out.update({f"{p}.{k}": v for k, v in conv.items()})
    return out


def quantized_state_dict(model, qcfg: dict, float_dtype=torch.float16) -> dict[str, torch.Tensor]:
    """Tensors to save: hub layouts for GPTQ/AWQ, module buffers otherwise; floats in ``float_dtype``."""
    method = qcfg["quant_method"]
    state = {}
    quant = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    for key, t in model.state_dict().items():
        prefix = key.rsplit(".", 1)[0]
        if prefix in quant and method in ("gptq", "awq") and not key.endswith(".bias"):
            continue
        packed = prefix in quant and not key.endswith(".bias")  # codes and scales keep their dtype
        if packed or not t.is_floating_point():
            state[key] = t
        else:  # fp16 as hub checkpoints are, unless that would round (e.g. AWQ's rescaled norms)
            low = t.to(float_dtype)
            state[key] = low if torch.equal(low.to(t.dtype), t) else t
    if method in ("gptq", "awq"):
        for name, mod in quant.items():
            parts = hub.to_gptq(mod, bool(qcfg.get("sym"))) if method == "gptq" else hub.to_awq(mod)
            state.update({f"{name}.{k}": v for k, v in parts.items()})
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def check_output_folder(folder: Path) -> None:
    """An output folder may be new, empty, or an earlier model folder (it is replaced); nothing else."""
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / "config.json").exists()
                                                   and not (folder / "model.gguf").exists())):
        raise CheckpointError(f"{folder} exists and is not a model folder: choose a new output folder")


@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike):
    """The loader's atomic folder (a temporary sibling renamed into place, removed on any error),
    after checking that ``folder`` is not something else that would be overwritten."""
    from inferlab.folders import atomic_folder as _atomic_folder

    check_output_folder(Path(folder))
    with _atomic_folder(folder) as tmp:
        yield tmp


def save_quantized(model, tokenizer, folder: str | os.PathLike, qcfg: dict) -> Path:
    """Write a quantized HF folder (config.json with quantization_config, model.safetensors, tokenizer)."""
    with atomic_folder(folder) as tmp:
        cfg = model.config.to_hf_dict()
        cfg["torch_dtype"] = "float16"
        cfg["quantization_config"] = qcfg
        save_file(quantized_state_dict(model, qcfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
    return Path(folder)
