"""Tiny random HF checkpoints for parity tests, written by transformers' own save_pretrained."""
from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 160

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)

VARIANTS = {
    "llama_gqa": ("llama", dict(num_key_value_heads=2)),
    "llama_mqa": ("llama", dict(num_key_value_heads=1)),
    "llama_mha_tied": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama_bias": ("llama", dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    "llama3_rope": ("llama", dict(num_key_value_heads=2, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "linear_rope": ("llama", dict(num_key_value_heads=2, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "qwen2_bias": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral": ("mistral", dict(num_key_value_heads=2, sliding_window=None)),
    "mistral_window8": ("mistral", dict(num_key_value_heads=2, sliding_window=8)),
    "mixtral_top2": ("mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "mixtral_top1_window8": ("mixtral", dict(num_key_value_heads=1, num_local_experts=3, num_experts_per_tok=1,
                                             sliding_window=8)),
}


def hf_model(kind: str, **overrides):
    import transformers

    cls_cfg, cls_model = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    }[kind]
    torch.manual_seed(0)
    model = cls_model(cls_cfg(**{**BASE, **overrides})).eval()
    with torch.no_grad():  # random biases so that a missing bias would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def classic_rope_form(folder: Path) -> None:
    """Rewrite transformers 5's ``rope_parameters`` as the ``rope_theta`` + ``rope_scaling`` form."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = params.pop("rope_theta", 10000.0)
    cfg["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    path.write_text(json.dumps(cfg, indent=2))


def save_variant(name: str, folder: Path, classic: bool = False, original_format: bool = True):
    """``original_format=False`` keeps transformers 5's in-memory names (Mixtral: fused experts)."""
    kind, overrides = VARIANTS[name]
    model = hf_model(kind, **overrides)
    model.save_pretrained(folder, save_original_format=original_format)
    if classic:
        classic_rope_form(folder)
    return model


TEXT = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "for i in range(10):\n    print(i)\n", "class A:\n    pass\n"]


def save_with_tokenizer(folder: Path):
    """A tiny Llama plus a byte-level BPE tokenizer.json (end-of-text id 0)."""
    from inferlab.model.tokenizer import train_bpe

    tok = train_bpe(TEXT * 20, vocab_size=300, min_frequency=0).hf
    model = hf_model("llama", num_key_value_heads=2, vocab_size=tok.get_vocab_size(),
                     bos_token_id=None, eos_token_id=0)
    model.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    return model
