"""Write a quantized model as a .gguf file that llama.cpp runs, through llama.cpp's own ``gguf`` package.

A GGUF file is one header of key/value metadata (architecture hyperparameters, the tokenizer's
vocabulary and merges) followed by aligned tensors, each with its llama.cpp type. The linear
weights are written as the very Q8_0 / Q4_0 / Q4_1 / Q4_K bytes inferlab computes with; embeddings are
F16 and norms F32, as llama.cpp's converter writes them. ``f32`` writes an unquantized model with
every tensor F32 (the converter's ``--outtype f32``): llama.cpp's own fp32 baseline.

One detail of the conversion: llama.cpp applies RoPE to interleaved pairs (x0, x1), (x2, x3), ...
while HF Llama rotates halves (x_i, x_{i + d/2}); the converter therefore permutes the rows of
q_proj and k_proj. Rows are independent blocks, so quantized rows are permuted as they are.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from inferlab.errors import InferlabError
from inferlab.model.gguf_loader import LAYER_NAMES, pre_tokenizer_name
from inferlab.quant.checkpoint import atomic_folder
from inferlab.quant.base import QuantLinear
from inferlab.quant.ggml import GGMLLinear

NAMES = {hf: name for name, hf in LAYER_NAMES.items()}  # HF module -> llama.cpp's tensor name


def rope_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF's half-rotation row order -> llama.cpp's interleaved order (convert_hf_to_gguf's ``permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _tokenizer_metadata(writer, tokenizer, cfg) -> None:
    import gguf
    raw = json.loads(tokenizer.hf.to_str())
    if raw["model"]["type"] != "BPE":
        raise InferlabError("GGUF export writes byte-level BPE tokenizers only")
    vocab = {tok: i for tok, i in raw["model"]["vocab"].items()}
    special = {t["id"] for t in raw.get("added_tokens", []) if t.get("special")}
    for t in raw.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    tokens = [""] * cfg.vocab_size
    for tok, i in vocab.items():
        if i < cfg.vocab_size:
            tokens[i] = tok
    user = {t["id"] for t in raw.get("added_tokens", []) if not t.get("special")}
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.USER_DEFINED if i in user
             else gguf.TokenType.NORMAL for i in range(cfg.vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in raw["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(tokenizer.hf))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    if cfg.eos_token_ids:
        writer.add_eos_token_id(cfg.eos_token_ids[0])
    writer.add_add_bos_token(False)
    if tokenizer.chat_template is not None and not tokenizer.chat_template.is_default:
        writer.add_chat_template(tokenizer.chat_template.source)


def write_gguf(model, tokenizer, out: str | os.PathLike, method: str, overwrite: bool = False) -> Path:
    """Write ``model`` (its linears GGMLLinear of type ``method``) to ``out``/model.gguf; returns the file."""
    try:
        import gguf
    except ImportError:
        raise InferlabError("writing .gguf needs llama.cpp's gguf package: pip install gguf") from None
    cfg = model.config
    if cfg.model_type not in ("llama", "mistral"):
        raise InferlabError(f"GGUF export writes Llama-architecture models, not {cfg.model_type}")
    if cfg.attention_bias or cfg.rope_scaling:
        raise InferlabError("GGUF export here covers plain Llama (no attention bias, no RoPE scaling)")
    qtypes = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
              "q4_1": gguf.GGMLQuantizationType.Q4_1, "q4_k": gguf.GGMLQuantizationType.Q4_K, "f32": None}
    if method not in qtypes:
        raise InferlabError(f"GGUF export writes {', '.join(qtypes)}, not {method!r}")
    block_types = {k: v for k, v in qtypes.items() if v is not None}
    ftype = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
             "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M,
             "f32": gguf.LlamaFileType.ALL_F32}[method]
    with atomic_folder(out, overwrite) as tmp:
        writer = gguf.GGUFWriter(str(tmp / "model.gguf"), "llama")
        writer.add_name(f"inferlab {Path(out).name}")
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_block_count(cfg.num_hidden_layers)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_head_count_kv(cfg.num_key_value_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_dimension_count(cfg.head_dim)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_file_type(ftype)
        _tokenizer_metadata(writer, tokenizer, cfg)

        def f16(t):
            return t.detach().float().cpu().numpy().astype(np.float16)

        def f32(t):
            return t.detach().float().cpu().numpy().astype(np.float32)

        embed = f32 if method == "f32" else f16
        head = model.lm_head if isinstance(model.lm_head, GGMLLinear) else None  # a quantized head
        if head is not None and head.ggml_type not in block_types:
            raise InferlabError(f"the output head is {head.ggml_type}: GGUF export writes {', '.join(block_types)}")
        if head is not None and cfg.tie_word_embeddings:  # one tensor serves both, as llama.cpp stores it
            writer.add_tensor("token_embd.weight", head.qweight.cpu().numpy(), raw_dtype=block_types[head.ggml_type])
        else:
            writer.add_tensor("token_embd.weight", embed(model.model.embed_tokens.weight))
        for i, layer in enumerate(model.model.layers):
            for hf, name in NAMES.items():
                mod = layer.get_submodule(hf)
                if name.endswith("norm"):
                    writer.add_tensor(f"blk.{i}.{name}.weight", f32(mod.weight))
                    continue
                if method == "f32":
                    if isinstance(mod, QuantLinear):
                        raise InferlabError(f"layer {i} {hf} is {type(mod).__name__}: f32 export takes an "
                                            "unquantized model (load it without --method)")
                    rows = mod.weight.detach().float()
                elif not isinstance(mod, GGMLLinear) or mod.ggml_type not in block_types:
                    raise InferlabError(f"layer {i} {hf} is not {method}: quantize with --method {method} first")
                else:  # each tensor in its own type (q4_k falls back to q4_1 where 256 does not divide)
                    rows = mod.qweight
                if hf.endswith("q_proj"):
                    rows = rope_permute(rows, cfg.num_attention_heads)
                elif hf.endswith("k_proj"):
                    rows = rope_permute(rows, cfg.num_key_value_heads)
                if method == "f32":
                    writer.add_tensor(f"blk.{i}.{name}.weight", f32(rows))
                else:
                    writer.add_tensor(f"blk.{i}.{name}.weight", rows.cpu().numpy(), raw_dtype=block_types[mod.ggml_type])
        writer.add_tensor("output_norm.weight", f32(model.model.norm.weight))
        if not cfg.tie_word_embeddings:
            if head is not None:
                writer.add_tensor("output.weight", head.qweight.cpu().numpy(), raw_dtype=block_types[head.ggml_type])
            else:
                writer.add_tensor("output.weight", embed(model.lm_head.weight))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(out) / "model.gguf"
