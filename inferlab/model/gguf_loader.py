"""Load a llama.cpp GGUF file: the format most people who run a model on a CPU already have.

A GGUF file is one header of key/value metadata (the architecture's hyperparameters, the whole
tokenizer, a chat template) followed by aligned tensors, each with its llama.cpp type (F32, F16,
Q8_0, Q4_1, Q4_K ...). Reading it takes three translations, all done here with llama.cpp's own
``gguf`` package as the reader:

- **config**: ``llama.block_count``, ``llama.embedding_length`` ... -> a :class:`ModelConfig`.
- **tokenizer**: ``tokenizer.ggml.tokens`` / ``merges`` / ``token_type`` and the ``pre`` name of
  the pre-tokenizer -> an HF ``tokenizers`` BPE, the same object a tokenizer.json describes.
- **tensors**: ``blk.0.attn_q.weight`` -> ``model.layers.0.self_attn.q_proj.weight``. llama.cpp
  rotates interleaved pairs in RoPE while HF Llama rotates halves, so its converter permuted the
  rows of q and k (``inferlab.quant.gguf_export.rope_permute``): they are permuted back. Rows
  are whole blocks, so packed rows move as they are.

``quantization`` picks what the weights become:

- ``None`` (as stored, what llama.cpp runs): a linear whose type inferlab has a packed format for
  (Q8_0, Q4_0, Q4_1, Q4_K) keeps its blocks and decodes through that format's loop; F32/F16 and
  every other type (Q6_K, Q5_0 ...) are dequantized to fp32. The token embedding is a lookup
  table and is dequantized; a lm_head tied to it runs its blocks (smollm2's Q8_0: 30 MB read per
  token instead of 113 MB in fp32).
- ``"none"``: every tensor dequantized to fp32, the baseline the lessons compare against. The
  result is written once as an ordinary HF folder under ``~/.cache/inferlab/gguf/<hash>``
  (:func:`hf_folder`), which ``inferlab.model.loader`` then reads like any other (so can transformers
  and tensor-parallel ranks).
- a method (``"int8"``, ``"q4_k"`` ...): ``LLM`` re-quantizes the fp32 weights with it.
"""
from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.errors import CheckpointError, InferlabError
from inferlab.folders import atomic_folder, cache_dir
from inferlab.model.linear import default_linear
from inferlab.model.tokenizer import Tokenizer

ARCHITECTURES = {"llama": "LlamaForCausalLM"}  # general.architecture -> the HF class it matches
#: llama.cpp's per-layer tensor names -> the HF module names (the GGUF writer uses it inverted)
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# The pre-tokenizer each ``tokenizer.ggml.pre`` names: how text is cut into words before BPE
# merges run inside each word (the regexes of llama.cpp's llama-vocab.cpp for these types).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "gpt-2": "gpt2", "default": "gpt2",  # GPT-2's own word regex
    "smollm": "digits",  # GPT-2's regex after cutting every digit on its own (SmolLM's tokenizer.json)
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
CONTROL, USER_DEFINED = 3, 4  # gguf.TokenType values the tokenizer keeps whole


def is_gguf(path: str | os.PathLike) -> bool:
    return Path(path).suffix == ".gguf"


class _Header(NamedTuple):
    """What the loaders read of a GGUF file: every metadata value, decoded, and the tensors' entries
    (name, type, shape, and their data still mapped from the file, not read)."""
    fields: dict
    tensors: list


def _reader(path: Path) -> _Header:
    """``path``'s header, parsed once per process for each version of the file (its size and
    modification time). llama.cpp's reader builds a numpy view for every string of the metadata:
    for smollm2's 49,152 tokens and 48,900 merges that is 2.3 s and 160 MB of objects, paid again
    by every load of the model (a notebook that compares batching policies loads it 7 times). The
    decoded values and the tensors' entries are kept; the reader and its views are dropped."""
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} not found")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    stat = path.stat()
    return _header(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _header(path: str, size: int, mtime_ns: int) -> _Header:
    try:
        import gguf
    except ImportError:
        raise CheckpointError("reading .gguf files needs llama.cpp's gguf package: pip install gguf") from None
    collecting = gc.isenabled()
    gc.disable()  # the reader's 10^5 small objects set off hundreds of collections: a quarter of its time
    try:
        reader = gguf.GGUFReader(path)
        return _Header({key: _contents(field) for key, field in reader.fields.items()}, list(reader.tensors))
    except Exception as exc:  # the reader fails deep inside numpy on a cut-off file
        raise CheckpointError(f"{path} could not be read as GGUF ({type(exc).__name__}): the file is probably "
                              f"truncated or damaged; copy or download it again") from None
    finally:
        if collecting:
            gc.enable()


class _Undecoded(NamedTuple):
    field: object  # a metadata field the reader could not decode (a type no loader here reads)


def _contents(field):
    """A metadata field's value, or the field kept undecoded: :func:`_field` asks it again, so only
    a loader that needs it fails, as before the header was cached."""
    try:
        return field.contents()
    except Exception:
        return _Undecoded(field)


def _field(reader: _Header, key: str, default=KeyError):
    if key not in reader.fields:
        if default is KeyError:
            raise CheckpointError(f"the GGUF metadata has no {key!r}: is it a complete model file?")
        return default
    value = reader.fields[key]
    return value.field.contents() if isinstance(value, _Undecoded) else value


def read_config(reader, path: Path) -> ModelConfig:
    """The model's shape from the metadata, as an HF config.json would give it."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path.name}: GGUF architecture {arch!r} is not supported: inferlab loads "
                              f"{', '.join(ARCHITECTURES)} GGUF files")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise CheckpointError(f"{path.name}: per-frequency RoPE factors (rope_freqs, Llama 3.1 scaling) in a GGUF "
                              f"are not supported: load the model's HF folder instead")

    def get(key, default=KeyError):
        return _field(reader, f"{arch}.{key}", default)

    heads, kv_heads = get("attention.head_count"), get("attention.head_count_kv", None)
    if isinstance(heads, list) or isinstance(kv_heads, list):
        raise CheckpointError(f"{path.name}: a head count per layer is not supported (inferlab's layers share one)")
    hidden = get("embedding_length")
    tokens = _field(reader, "tokenizer.ggml.tokens", [])
    scaling = get("rope.scaling.type", "none")
    raw = {
        "architectures": [ARCHITECTURES[arch]],
        "vocab_size": get("vocab_size", None) or len(tokens),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads or heads,
        "head_dim": get("attention.key_length", None) or hidden // heads,
        "max_position_embeddings": get("context_length", 2048),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_scaling": None if scaling == "none" else {"rope_type": scaling,
                                                        "factor": float(get("rope.scaling.factor", 1.0))},
        "attention_bias": "blk.0.attn_q.bias" in names,
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id", None),
        "torch_dtype": "float32",
    }
    return ModelConfig.from_dict(raw)


def read_tokenizer(reader, path: Path, config: ModelConfig) -> Tokenizer:
    """An HF ``tokenizers`` byte-level BPE from ``tokenizer.ggml.*`` (gpt2-type vocabularies)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind = _field(reader, "tokenizer.ggml.model", None)
    if kind != "gpt2":
        raise CheckpointError(f"{path.name}: tokenizer type {kind!r} is not supported: inferlab builds byte-level "
                              f"BPE tokenizers (tokenizer.ggml.model = gpt2)")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{path.name}: pre-tokenizer {pre!r} is not supported (its word-splitting rule is "
                              f"unknown here): inferlab knows {', '.join(PRE_TOKENIZERS)}")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    hf = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    split = PRE_TOKENIZERS[pre]
    if split in ("gpt2", "digits"):
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.pre_tokenizer = (byte_level if split == "gpt2" else
                            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]))
    else:
        hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(tokens, types) if kind == CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    bos = config.bos_token_id
    if _field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
        hf.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                          special_tokens=[(tokens[bos], bos)])
    eos = [i for i in (_field(reader, "tokenizer.ggml.eos_token_id", None),
                       _field(reader, "tokenizer.ggml.eot_token_id", None)) if i is not None]
    tokenizer = Tokenizer(hf, tuple(dict.fromkeys(eos)), bos)
    template = _field(reader, "tokenizer.chat_template", None)
    if template is not None:
        from inferlab.model.chat import ChatTemplate, special_tokens_of
        tokenizer.chat_template = ChatTemplate(template, special_tokens_of(tokenizer))
    return tokenizer


def pre_tokenizer_name(hf) -> str:
    """The ``tokenizer.ggml.pre`` name of an HF tokenizer's pre-tokenizer (what the GGUF writer
    stores, so llama.cpp and this loader split words the same way), the inverse of PRE_TOKENIZERS."""
    pre = json.loads(hf.to_str()).get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:
        regex = parts[0].get("pattern", {}).get("Regex")
        for name, split in PRE_TOKENIZERS.items():
            if split == regex:
                return name
    raise InferlabError(f"this tokenizer's pre-tokenizer ({' + '.join(map(str, kinds))}) has no llama.cpp name: "
                        f"GGUF export writes {', '.join(sorted(set(PRE_TOKENIZERS)))}")


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (KeyError: not a model tensor)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    return f"{TOP_NAMES[parts[0]]}.{parts[1]}"


def unpermute_rope(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's interleaved RoPE row order -> HF's half-rotation order (inverse of ``rope_permute``)."""
    return rows.reshape(n_head, rows.shape[0] // n_head // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _raw(t) -> torch.Tensor:
    """A tensor's bytes as stored (uint8 [out, bytes per row] for blocks), copied: the file is mapped read-only."""
    return torch.from_numpy(np.array(t.data))


def _dequantize(t) -> torch.Tensor:
    """One GGUF tensor as fp32 [out, in] (llama.cpp's shape is reversed: ne0 is the input width)."""
    import gguf
    from inferlab.quant import ggml

    kind = t.tensor_type.name.lower()
    if kind in ggml.DEQUANTIZE:  # inferlab's own torch code for the types it packs (faster than numpy)
        shape = [int(n) for n in reversed(t.shape)]
        return ggml.DEQUANTIZE[kind](_raw(t)).reshape(shape)
    try:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise CheckpointError(f"tensor {t.name} has type {t.tensor_type.name}, which no dequantizer here "
                              f"reads: re-quantize the model to a common type (Q8_0, Q4_K_M) with llama.cpp") from None
    return torch.from_numpy(np.array(values, dtype=np.float32))


def _packed_type(t) -> str | None:
    """The inferlab format that runs this tensor's blocks as stored, or None (dequantize it)."""
    from inferlab.quant import ggml
    kind = t.tensor_type.name.lower()
    return kind if kind in ggml.BLOCKS else None


def _read_tensors(reader, config: ModelConfig, as_stored: bool) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """HF-named tensors (rows un-permuted) and, as stored, the block type of each packed linear."""
    tensors, packed = {}, {}
    for t in reader.tensors:
        try:
            name = hf_name(t.name)
        except (KeyError, IndexError):
            raise CheckpointError(f"tensor {t.name!r} is not part of a {config.model_type} model: is the "
                                  f"architecture in the metadata right?") from None
        kind = _packed_type(t) if as_stored and len(t.shape) == 2 else None
        if kind is not None and t.name == "token_embd.weight":
            # the lookup table is dequantized; a tied head runs the very blocks, as llama.cpp does
            tensors["model.embed_tokens.weight"] = _dequantize(t).float()
            if config.tie_word_embeddings:
                tensors["lm_head.qweight"] = _raw(t)
                packed["lm_head"] = kind
            continue
        if kind is not None:
            value = _raw(t)
            packed[name.removesuffix(".weight")] = kind
        else:
            value = _dequantize(t).float()
        if ".self_attn.q_proj." in name or ".self_attn.k_proj." in name:
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            value = unpermute_rope(value, heads)
        tensors[name if kind is None else name.replace(".weight", ".qweight")] = value
    return tensors, packed


def _read(path: Path, as_stored: bool):
    """(config, tokenizer, HF-named tensors, block type of each packed linear) of a GGUF file."""
    reader = _reader(path)
    config = read_config(reader, path)
    return (config, read_tokenizer(reader, path, config), *_read_tensors(reader, config, as_stored))


def read_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """The pieces of a GGUF model with its blocks as stored, for ``inferlab.model.loader`` to assemble:
    (the model built on the meta device, its tensors, the names it expects, the names the file has
    beyond them, the tokenizer)."""
    from inferlab.model.llama import CausalLM, on_meta
    from inferlab.quant.ggml import GGMLLinear

    path = Path(path)
    config, tokenizer, tensors, packed = _read(path, as_stored=True)

    def build(in_features: int, out_features: int, bias: bool, name: str) -> nn.Module:
        if name in packed:
            return GGMLLinear(in_features, out_features, bias, packed[name])
        return default_linear(in_features, out_features, bias, name)

    with on_meta():
        model = CausalLM(config, build)
    state = model.checkpoint_state_dict()
    unexpected = [k for k in tensors if k not in state]
    for key in unexpected:
        del tensors[key]
    for key, value in tensors.items():
        if tuple(value.shape) != tuple(state[key].shape):
            raise CheckpointError(f"{path.name}: tensor {key} has shape {tuple(value.shape)}, the metadata "
                                  f"implies {tuple(state[key].shape)}")
        if value.dtype != torch.uint8:  # packed blocks keep their bytes
            tensors[key] = value.to(dtype)
    return model, tensors, list(state.keys()), unexpected, tokenizer


def file_key(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256: the cache key of what is derived from it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def hf_folder(path: str | os.PathLike) -> Path:
    """The GGUF dequantized to an HF folder (config.json, fp32 model.safetensors, tokenizer.json and
    the chat template: ``Tokenizer.save_folder``) that inferlab and transformers both load.
    Written once under ``~/.cache/inferlab/gguf/<name>-<hash>`` (``INFERLAB_CACHE``), atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} not found")
    folder = cache_dir() / "gguf" / f"{path.stem}-{file_key(path)}"
    if (folder / "config.json").exists():
        return folder
    config, tokenizer, tensors, _ = _read(path, as_stored=False)
    with atomic_folder(folder) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
        tokenizer.save_folder(tmp)
        (tmp / "source.json").write_text(json.dumps({"gguf": str(path), "sha256_16": folder.name.rsplit("-", 1)[1]}) + "\n")
    return folder
