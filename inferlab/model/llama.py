"""A Llama-family decoder (Llama, Mistral, Qwen2; Mixtral with ``inferlab.model.moe``) in one file.

    tokens -> embed -> N x [RMSNorm -> attention (RoPE, GQA) -> + -> RMSNorm -> SwiGLU MLP -> +]
           -> RMSNorm -> lm_head -> logits

Parameter names match HF transformers, so checkpoints load either way. Two seams keep every
technique of the course outside this file:
- the *attention backend* (``inferlab.attention``) decides where K/V are cached and how
  attention is computed (torch SDPA, paged cache, Triton kernels);
- the *linear factory* (``inferlab.model.linear``) builds every projection, so quantized linears
  drop in without touching the model.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.attention import (AttentionBackend, AttentionMetadata, PagedAttentionMetadata, TorchSDPABackend,
                                attention_mask)
from inferlab import loop_settings
from inferlab.model import decode_layers, glue
from inferlab.model.config import ModelConfig
from inferlab.model.linear import LinearFactory, default_linear
from inferlab.model.moe import SparseMoeBlock
from inferlab.model.packing import use_packed
from inferlab.model.rope import apply_rope, rope_cos_sin, rope_inv_freq


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019): LayerNorm without the mean, computed in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one loop (model/glue.c), else torch's fused kernel
            out = glue.rms_norm(x, self.weight, self.eps)
            return out if out is not None else F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Grouped-query attention (Ainslie et al. 2023): Hq query heads share Hkv key/value heads.
    Hkv == Hq is classic multi-head attention, Hkv == 1 is multi-query attention (Shazeer 2019)."""

    def __init__(self, cfg: ModelConfig, idx: int, linear: LinearFactory, prefix: str):
        super().__init__()
        self.layer_idx = idx
        self.head_dim = cfg.head_dim
        # the heads this module computes: all of them, or a tensor-parallel rank's share (inferlab.parallel)
        local_heads = getattr(linear, "attention_heads", None)
        self.n_heads, self.n_kv = (local_heads(cfg) if local_heads
                                   else (cfg.num_attention_heads, cfg.num_key_value_heads))
        d, q, kv = cfg.hidden_size, cfg.num_attention_heads * self.head_dim, cfg.num_key_value_heads * self.head_dim
        self.q_proj = linear(d, q, cfg.attention_bias, f"{prefix}.q_proj")
        self.k_proj = linear(d, kv, cfg.attention_bias, f"{prefix}.k_proj")
        self.v_proj = linear(d, kv, cfg.attention_bias, f"{prefix}.v_proj")
        self.o_proj = linear(q, d, cfg.o_proj_bias, f"{prefix}.o_proj")
        self.backend: AttentionBackend = TorchSDPABackend()

    def forward(self, x, cos, sin, metadata: AttentionMetadata):
        b, t, _ = x.shape
        packed = use_packed(self, "packed_qkv", self.q_proj, self.k_proj, self.v_proj)
        q, k, v = packed(x) if packed else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if not glue.rope_(cos, sin, q, k):  # in place, one loop each (model/glue.c), where it runs
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.backend.forward(self.layer_idx, q, k, v, metadata)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, linear: LinearFactory, prefix: str):
        super().__init__()
        d, f, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = linear(d, f, bias, f"{prefix}.gate_proj")
        self.up_proj = linear(d, f, bias, f"{prefix}.up_proj")
        self.down_proj = linear(f, d, bias, f"{prefix}.down_proj")

    def forward(self, x):
        packed = use_packed(self, "packed_gate_up", self.gate_proj, self.up_proj)
        gate, up = packed(x) if packed else (self.gate_proj(x), self.up_proj(x))
        act = glue.silu_mul(gate, up)  # one loop (model/glue.c), where it runs
        return self.down_proj(F.silu(gate) * up if act is None else act)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, idx: int, linear: LinearFactory):
        super().__init__()
        prefix = f"model.layers.{idx}"
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, idx, linear, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoeBlock(cfg, linear, f"{prefix}.mlp") if cfg.num_local_experts else MLP(cfg, linear, f"{prefix}.mlp")

    def forward(self, x, cos, sin, metadata):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


STOCK = (DecoderLayer, Attention, MLP, RMSNorm)  # what inferlab.model.decode_layers runs in C


class DecoderStack(nn.Module):
    """HF's ``model.*`` submodule: embeddings, layers and the final norm."""

    def __init__(self, cfg: ModelConfig, linear: LinearFactory):
        super().__init__()
        # a factory may build the embedding too (a tensor-parallel one shards the vocabulary)
        self.embed_tokens = getattr(linear, "embedding", nn.Embedding)(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, linear) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """``model(input_ids)`` -> logits [B, T, V]. With ``metadata`` it reads and writes a KV cache.

    A ragged batch (``PagedAttentionMetadata``) is passed as input_ids [1, N]: the new tokens of
    every sequence side by side; ``logits_indices`` picks the rows whose logits are wanted (each
    sequence's last token), so the lm_head runs on those rows only.
    """

    def __init__(self, config: ModelConfig, linear_factory: LinearFactory = default_linear):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config, linear_factory)
        self.lm_head = linear_factory(config.hidden_size, config.vocab_size, False, "lm_head")
        self.tie_weights()
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._feature_sinks: list[list] = []  # see last_layer_outputs

    def tie_weights(self) -> None:
        """With tied embeddings (Press & Wolf 2017) the output projection *is* the input embedding
        matrix: one tensor, stored once. Call again after loading or replacing either weight. A
        quantized head (a GGUF's Q8_0 token embedding, run as stored) keeps its own codes and is
        not tied: the lookup table reads one row per token, the head every row."""
        if self.config.tie_word_embeddings and not hasattr(self.lm_head, "dequantize"):  # not a QuantLinear
            self.lm_head.weight = self.model.embed_tokens.weight

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint stores: the state dict without the tied copy of the embedding."""
        state = self.state_dict()
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        # a packed projection's weight views rows of a larger tensor: save its own copy
        return {k: v.clone() if v.untyped_storage().nbytes() != v.numel() * v.element_size() else v
                for k, v in state.items()}

    @contextlib.contextmanager
    def last_layer_outputs(self):
        """Collect the last decoder layer's output [1, N, H] (every row, before the final norm) of
        each forward run inside the block: EAGLE's features. The forward appends to a list rather
        than a hook watching the layer, so a decode step still runs its layers in one C call."""
        seen: list[torch.Tensor] = []
        self._feature_sinks.append(seen)
        try:
            yield seen
        finally:
            self._feature_sinks.remove(seen)

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        """Route every layer's attention through ``backend`` (the attention seam)."""
        for layer in self.model.layers:
            layer.self_attn.backend = backend

    def forward(self, input_ids: torch.Tensor, metadata: AttentionMetadata | PagedAttentionMetadata | None = None,
                last_only: bool = False, logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        if torch.compiler.is_compiling():  # a graph reads the loop settings once, when it is traced
            return self._forward(input_ids, metadata, last_only, logits_indices)
        with loop_settings.held():  # the loop settings, read once for the whole pass
            return self._forward(input_ids, metadata, last_only, logits_indices)

    def _forward(self, input_ids, metadata, last_only, logits_indices) -> torch.Tensor:
        if metadata is None:
            b, t = input_ids.shape
            positions = torch.arange(t, device=input_ids.device).expand(b, t)
            metadata = AttentionMetadata(positions=positions)
        if isinstance(metadata, PagedAttentionMetadata):
            metadata.build_masks(self.config.sliding_window)  # once per forward, shared by every layer
        elif metadata.attn_mask is None:  # built once here, shared by every layer
            metadata.attn_mask = attention_mask(input_ids.shape[1], metadata.cache_start, metadata.key_mask,
                                                self.config.sliding_window, input_ids.device)
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(self.inv_freq, metadata.positions, x.dtype)
        if not decode_layers.run(self, x, cos, sin, metadata, STOCK):  # a decode step's layers in one C call, where it runs
            for layer in self.model.layers:
                x = layer(x, cos, sin, metadata)
        for seen in self._feature_sinks:
            seen.append(x)
        if logits_indices is not None:
            x = x[:, logits_indices]
        elif last_only:
            x = x[:, -1:]
        return self.lm_head(self.model.norm(x)).float()

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() yields a tied weight once


_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "kaiming_uniform_",
          "kaiming_normal_", "xavier_uniform_", "xavier_normal_")


def _keep(tensor, *args, **kwargs):
    return tensor


@contextlib.contextmanager
def on_meta():
    """Build modules on the meta device (shapes only, no memory) for a checkpoint to fill, skipping
    their random initialisation as transformers' ``no_init_weights`` does: on meta it draws nothing,
    yet its meta kernels import ``torch._dynamo``, a second of every process that loads a model.
    (It swaps ``torch.nn.init``'s functions while the block runs: build nothing real beside it.)"""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(nn.init, name, _keep)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)
