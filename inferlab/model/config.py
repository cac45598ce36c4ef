"""Model configuration read from an HF ``config.json``.

Llama, Mistral and Qwen2 share one decoder shape; their configs differ only in a few keys
(attention bias, sliding window, how RoPE is described). ``ModelConfig`` normalises them.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from inferlab.errors import CheckpointError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", "factor": ..., ...}
    attention_bias: bool = False  # bias on q/k/v (Qwen2), and on o_proj for Llama's flag
    o_proj_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"
    # mixture of experts (Mixtral): 0 experts means a dense MLP in every layer
    num_local_experts: int = 0
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.0  # weight of the load-balancing loss in training

    @property
    def model_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def num_params_hint(self) -> int:
        """Parameter count computed from the shapes (embeddings counted once when tied)."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        experts = self.num_local_experts or 1
        router = d * self.num_local_experts
        layer = d * (q + 2 * kv) + q * d + experts * 3 * d * f + router + 2 * d
        return v * d * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + d

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            name = ", ".join(archs) or raw.get("model_type", "unknown")
            raise CheckpointError(
                f"unsupported architecture {name!r}: inferlab runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        rope_theta, rope_scaling = _rope_from_config(raw)
        kind = SUPPORTED_ARCHITECTURES[arch]
        if kind == "qwen2":  # Qwen2 always has q/k/v bias and never an o_proj bias
            attn_bias, o_bias = True, False
        else:
            attn_bias = o_bias = bool(raw.get("attention_bias", False))
        window = raw.get("sliding_window")
        if kind == "mixtral" and raw.get("num_experts_per_tok", 2) > raw.get("num_local_experts", 8):
            raise CheckpointError("num_experts_per_tok exceeds num_local_experts in config.json: "
                                  "each token can choose at most every expert")
        if kind == "qwen2":
            if raw.get("use_sliding_window", False):  # Qwen2 windows only some layers
                raise CheckpointError("Qwen2 with use_sliding_window=true (a window on some layers only) "
                                      "is not supported: set use_sliding_window to false in config.json")
            window = None
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"unsupported hidden_act {act!r}: inferlab implements SwiGLU (silu)")
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            attention_bias=attn_bias,
            o_proj_bias=o_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=window,
            architecture=arch,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            hidden_act=act,
            **({"num_local_experts": raw.get("num_local_experts", 8),
                "num_experts_per_tok": raw.get("num_experts_per_tok", 2),
                "router_aux_loss_coef": raw.get("router_aux_loss_coef", 0.001)} if kind == "mixtral" else {}),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json that transformers reads back (classic rope_theta/rope_scaling form)."""
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": self.hidden_act,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) > 1
            else (self.eos_token_ids[0] if self.eos_token_ids else None),
            "torch_dtype": "float32",
        }
        if self.model_type == "llama":
            out.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        if self.model_type in ("mistral", "mixtral"):
            out["sliding_window"] = self.sliding_window
        if self.model_type == "mixtral":
            out.update(num_local_experts=self.num_local_experts, num_experts_per_tok=self.num_experts_per_tok,
                       router_aux_loss_coef=self.router_aux_loss_coef)
        if self.model_type == "qwen2":
            out.update(use_sliding_window=self.sliding_window is not None,
                       sliding_window=self.sliding_window)
        return out


def _rope_from_config(raw: dict[str, Any]) -> tuple[float, dict | None]:
    """Read RoPE from either form: ``rope_theta`` + ``rope_scaling`` (most hub checkpoints)
    or ``rope_parameters`` (written by transformers 5)."""
    params = raw.get("rope_parameters")
    if params is not None:
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = raw.get("rope_theta", 10000.0)
        scaling = dict(raw["rope_scaling"]) if raw.get("rope_scaling") else {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type not in ("linear", "llama3"):
        raise CheckpointError(
            f"unsupported rope scaling {rope_type!r}: inferlab implements default, linear and llama3"
        )
    scaling["rope_type"] = rope_type
    scaling.pop("type", None)
    return float(theta), scaling
