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
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from inferlab.errors import CheckpointError
from inferlab.model.linear import default_linear
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
    for name, own in qcfg.get("modules", {}).items():
        if own.get("quant_method", method) not in METHODS:
            raise CheckpointError(f"{folder}: {name} is stored as {own.get('quant_method')!r}, which inferlab "
                                  f"does not load: choose one of {', '.join(METHODS)}")
    return qcfg


def tensor_config(qcfg: dict, name: str) -> tuple[str, int, int | None]:
    """(method, bits, group size) that ``name`` is stored with: the folder's method, or the tensor's
    own entry in ``quantization_config["modules"]`` (a smaller group, a fallback type, the head)."""
    own = qcfg.get("modules", {}).get(name, {})
    if "quant_method" in own:  # another format: its own bits and block
        spec = METHODS[own["quant_method"]]
        return own["quant_method"], spec.default_bits, spec.default_group
    method = qcfg["quant_method"]
    bits = int(qcfg.get("bits", METHODS[method].default_bits))
    return method, bits, own.get("group_size", qcfg.get("group_size", qcfg.get("block_size")))


def linear_factory(qcfg: dict):
    """The linear factory that builds, for every projection, the module its tensors were stored as
    (``lm_head`` stays a float linear unless ``modules`` names it)."""
    def build(in_features: int, out_features: int, bias: bool, name: str) -> nn.Module:
        if name == "lm_head" and name not in qcfg.get("modules", {}):
            return default_linear(in_features, out_features, bias, name)
        method, bits, group = tensor_config(qcfg, name)
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


def _hub_prefixes(tensors) -> set[str]:
    """The linears stored in the hub GPTQ/AWQ layout: those with a ``qzeros`` (not a quantized head)."""
    return {k.rsplit(".", 1)[0] for k in tensors if k.endswith(".qzeros")}


def convert_checkpoint(qcfg: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hub GPTQ/AWQ tensors -> Int4Linear buffers; other methods are stored as the modules hold them."""
    method = qcfg["quant_method"]
    if method not in ("gptq", "awq"):
        return tensors
    prefixes = _hub_prefixes(tensors)
    out = {k: v for k, v in tensors.items()
           if not (k.rsplit(".", 1)[0] in prefixes and k.rsplit(".", 1)[1] in HUB_SUFFIXES)}
    for p in sorted(prefixes):
        part = {s: tensors[f"{p}.{s}"] for s in HUB_SUFFIXES if f"{p}.{s}" in tensors}
        if method == "gptq":
            _, bits, group = tensor_config(qcfg, p)
            conv = hub.from_gptq(part, bits, int(group), bool(qcfg.get("desc_act")),
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
    hub_layout = {n: m for n, m in quant.items() if method in ("gptq", "awq") and isinstance(m, Int4Linear)}
    for key, t in model.state_dict().items():
        prefix = key.rsplit(".", 1)[0]
        if prefix in hub_layout and not key.endswith(".bias"):
            continue
        packed = prefix in quant and not key.endswith(".bias")  # codes and scales keep their dtype
        if packed or not t.is_floating_point():
            state[key] = t
        else:  # fp16 as hub checkpoints are, unless that would round (e.g. AWQ's rescaled norms)
            low = t.to(float_dtype)
            state[key] = low if torch.equal(low.to(t.dtype), t) else t
    if hub_layout:
        for name, mod in hub_layout.items():
            parts = hub.to_gptq(mod, bool(qcfg.get("sym"))) if method == "gptq" else hub.to_awq(mod)
            state.update({f"{name}.{k}": v for k, v in parts.items()})
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


MANIFEST = ".inferlab-files.json"  # the names inferlab wrote into a folder: the only ones it may replace
# Everything a tokenizer or generation needs besides the weights: copied from the source folder as is,
# so a quantized instruct model keeps its special tokens, chat template and generation defaults.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "generation_config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")


def _written_by_inferlab(folder: Path) -> set[str]:
    try:
        return set(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def check_output_folder(folder: Path, overwrite: bool = False, source: Path | None = None) -> None:
    """Refuse an output folder that writing would lose a file in.

    A new or empty folder is fine, and so is one inferlab wrote earlier (its manifest lists every
    file in it). A folder holding anything else needs ``overwrite``, and even then only the names
    inferlab writes are replaced. The input model's folder (or a folder inside it) is never written.
    """
    folder = Path(folder)
    if source is not None:
        src, out = Path(source).resolve(), folder.resolve()
        if out == src or src in out.parents:
            raise CheckpointError(f"--out {folder} is {'the input model folder' if out == src else 'inside the input model folder'}"
                                  f" {source}: choose a new output folder (inferlab never writes into the model it reads)")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise CheckpointError(f"--out {folder} is a file, not a folder: choose a new output folder")
    foreign = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST and p.name not in _written_by_inferlab(folder))
    if not foreign:
        return
    shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
    if not overwrite:
        raise CheckpointError(f"--out {folder} already holds files inferlab did not write ({shown}): choose a new "
                              f"output folder, or pass --overwrite to replace only the files inferlab writes there")
    weights = [n for n in foreign if n.endswith(_WEIGHT_SUFFIXES) and n not in ("model.safetensors", "model.gguf")]
    if weights or (folder / "model.safetensors.index.json").exists():
        raise CheckpointError(f"--out {folder} holds other weights ({', '.join(weights) or 'a sharded index'}) that "
                              f"would be loaded beside the new ones: choose a new output folder")


@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike, overwrite: bool = False, source: str | os.PathLike | None = None):
    """Yield a temporary sibling of ``folder`` to write into; commit it only when the block succeeds.

    A new folder appears in one rename (the loader's :func:`~inferlab.model.loader.atomic_folder`). Into an
    existing folder (see :func:`check_output_folder`) each written file replaces its namesake in one
    rename, files an earlier inferlab run wrote and this one does not are removed, and nothing else
    is touched. Every file is left readable by all (0644 under the usual umask), as a model folder is.
    """
    from inferlab.folders import atomic_folder as _atomic_folder

    folder = Path(folder)
    check_output_folder(folder, overwrite, Path(source) if source is not None else None)
    umask = os.umask(0)
    os.umask(umask)
    if not folder.exists():
        with _atomic_folder(folder) as tmp:
            yield tmp
            _seal(tmp, umask)
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        yield tmp
        previous = _written_by_inferlab(folder)
        _seal(tmp, umask)
        for name in sorted(previous - {p.name for p in tmp.iterdir()}):
            if (folder / name).is_file():
                (folder / name).unlink()
        for p in sorted(tmp.iterdir(), key=lambda p: p.name == MANIFEST):  # the manifest last
            os.replace(p, folder / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _seal(tmp: Path, umask: int) -> None:
    """Set every file's mode to 0666 & ~umask (safetensors writes 0600) and write the manifest."""
    names = sorted(p.name for p in tmp.iterdir() if p.name != MANIFEST)
    (tmp / MANIFEST).write_text(json.dumps({"files": names}) + "\n")
    for p in tmp.iterdir():
        p.chmod(0o666 & ~umask)


def copy_tokenizer_files(source: Path | None, tmp: Path, tokenizer) -> None:
    """The source folder's tokenizer and generation files, byte for byte; else the tokenizer itself."""
    copied = set()
    for name in TOKENIZER_FILES if source is not None else ():
        if (Path(source) / name).is_file():
            shutil.copyfile(Path(source) / name, tmp / name)
            copied.add(name)
    if tokenizer is not None and "tokenizer.json" not in copied:
        tokenizer.save_folder(tmp)


def save_quantized(model, tokenizer, folder: str | os.PathLike, qcfg: dict, source: str | os.PathLike | None = None,
                   overwrite: bool = False) -> Path:
    """Write a quantized HF folder: config.json with quantization_config, model.safetensors, and the
    tokenizer (every tokenizer and generation file of ``source``, the folder the model came from)."""
    with atomic_folder(folder, overwrite, source) as tmp:
        cfg = model.config.to_hf_dict()
        cfg["torch_dtype"] = "float16"
        cfg["quantization_config"] = qcfg
        save_file(quantized_state_dict(model, qcfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        copy_tokenizer_files(Path(source) if source is not None else None, tmp, tokenizer)
    return Path(folder)
