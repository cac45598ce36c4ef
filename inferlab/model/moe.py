"""Mixture of experts (Mixtral, Jiang et al. 2024): many feed-forward experts, few used per token.

A sparse MoE block replaces the dense SwiGLU MLP of a decoder layer by ``E`` SwiGLU *experts*
and a *router* (a linear layer, ``gate``) that scores the experts for each token:

    probs   = softmax(gate(x))                 # [tokens, E]
    w, idx  = topk(probs, k)                   # the k best experts of each token
    w       = w / w.sum(-1)                    # renormalised over the chosen k
    y       = sum_j w_j * expert_{idx_j}(x)

So the model holds ``E`` experts' parameters but each token runs only ``k`` of them: compute per
token follows the *active* parameters, memory follows the *total*. At batch 1 a decode step reads
only the chosen experts' weights; at large batch nearly every expert is chosen by some token.

The dispatch here is *grouped*: the (token, expert) pairs are sorted by expert, so each expert
multiplies one contiguous block of tokens with one matmul, and the results are scattered back,
weighted, with ``index_add_``. Expert-parallel engines shard the same loop across devices.

Training needs the router to spread tokens: left alone it collapses onto a few experts. The
auxiliary load-balancing loss of Switch Transformer (Fedus et al. 2021, eqs. 4-6), as Mixtral uses
it, is ``E * sum_e f_e * P_e`` with ``f_e`` the fraction of top-k choices that went to expert ``e``
and ``P_e`` the mean router probability of ``e``; it is smallest (= k) when both are uniform.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.model.linear import LinearFactory


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's top-k routing: softmax over all experts (in fp32), keep the ``top_k`` best,
    renormalise their probabilities to sum to 1. Returns ``(weights, experts)``, both [N, top_k]."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


def load_balancing_loss(router_logits: list[torch.Tensor] | tuple[torch.Tensor, ...], num_experts: int,
                        top_k: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss over the router logits of every MoE layer ([N, E] each):
    ``E * sum_e f_e * P_e``, with ``f_e`` = top-k assignments to ``e`` per token and ``P_e`` = mean
    router probability of ``e``, both pooled over layers and tokens. ``f`` is not differentiable;
    the gradient flows through ``P`` and pushes probability away from overloaded experts."""
    logits = torch.cat([r.float() for r in router_logits])
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.topk(probs, top_k, dim=-1).indices
    tokens_per_expert = torch.zeros(num_experts, device=logits.device).index_add_(
        0, chosen.reshape(-1), torch.ones(chosen.numel(), device=logits.device)) / logits.shape[0]
    return num_experts * torch.sum(tokens_per_expert * probs.mean(dim=0))


def expert_load(router_logits: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """Fraction of the top-k choices that went to each expert ([E], sums to 1)."""
    chosen = route(router_logits, top_k)[1].reshape(-1)
    return torch.bincount(chosen, minlength=num_experts).float() / chosen.numel()


class Expert(nn.Module):
    """One SwiGLU expert, named as Mixtral's checkpoints name it: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, intermediate: int, linear: LinearFactory, prefix: str):
        super().__init__()
        self.w1 = linear(hidden, intermediate, False, f"{prefix}.w1")
        self.w2 = linear(intermediate, hidden, False, f"{prefix}.w2")
        self.w3 = linear(hidden, intermediate, False, f"{prefix}.w3")

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """Router + experts with grouped dispatch. After each forward, ``router_logits`` [N, E] holds
    the router's scores (training adds the load-balancing loss from them; notebooks plot them)."""

    def __init__(self, cfg: ModelConfig, linear: LinearFactory, prefix: str):
        super().__init__()
        self.num_experts, self.top_k = cfg.num_local_experts, cfg.num_experts_per_tok
        self.gate = linear(cfg.hidden_size, self.num_experts, False, f"{prefix}.gate")
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, cfg.intermediate_size, linear, f"{prefix}.experts.{e}")
                                     for e in range(self.num_experts))
        self.router_logits: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.reshape(-1, hidden.shape[-1])                       # [N, D]
        self.router_logits = self.gate(x)                              # [N, E]
        weights, experts = route(self.router_logits, self.top_k)       # [N, k] each
        return dispatch(x, weights, experts, lambda e, rows: self.experts[e](rows)).view_as(hidden)


def dispatch(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, expert_fn) -> torch.Tensor:
    """Grouped dispatch: ``y[n] = sum_j weights[n, j] * expert_fn(experts[n, j], x[n])``, computed
    with one call of ``expert_fn(e, rows)`` per expert on all the rows routed to it."""
    top_k = experts.shape[1]
    flat = experts.reshape(-1)                                         # one row per (token, choice)
    order = torch.argsort(flat, stable=True)                           # group the rows by expert
    token = order // top_k                                             # which token each row reads
    counts = torch.bincount(flat, minlength=int(flat.max()) + 1 if flat.numel() else 0).tolist()
    outputs = [expert_fn(e, rows) for e, rows in enumerate(x[token].split(counts)) if counts[e]]
    if not outputs:
        return torch.zeros_like(x)
    y = torch.cat(outputs) * weights.reshape(-1)[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)                 # weighted sum back per token


def sparse_moe_forward(x: torch.Tensor, gate_weight: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                       w3: torch.Tensor, top_k: int) -> torch.Tensor:
    """The whole block as a function of its weights: x [N, D], gate_weight [E, D], w1 and w3
    [E, F, D], w2 [E, D, F] (Mixtral's per-expert matrices stacked) -> [N, D]."""
    weights, experts = route(F.linear(x, gate_weight), top_k)
    return dispatch(x, weights, experts, lambda e, rows: F.linear(F.silu(F.linear(rows, w1[e])) * F.linear(rows, w3[e]), w2[e]))


def moe_blocks(model: nn.Module) -> list[SparseMoeBlock]:
    return [m for m in model.modules() if isinstance(m, SparseMoeBlock)]


def expected_experts_touched(num_experts: int, top_k: int, batch: int) -> float:
    """How many distinct experts a batch of tokens uses per layer, if each token picks ``top_k``
    of ``num_experts`` uniformly: ``E * (1 - (1 - k/E)^B)``. At batch 1 a decode step reads k
    experts' weights; by batch ~E/k * 3 it reads nearly all of them."""
    return num_experts * (1 - (1 - top_k / num_experts) ** batch)


def active_parameters(cfg: ModelConfig) -> int:
    """Parameters one token uses: everything but the experts it was not routed to."""
    idle = cfg.num_local_experts - cfg.num_experts_per_tok if cfg.num_local_experts else 0
    return cfg.num_params_hint - cfg.num_hidden_layers * idle * 3 * cfg.hidden_size * cfg.intermediate_size


# ---------------------------------------------------------------- checkpoint names

# Mixtral checkpoints on the hub (and what transformers' save_pretrained writes) name the block
# ``block_sparse_moe`` with one ``experts.{e}.w1/w2/w3`` per expert; inferlab names it ``mlp``, as
# transformers 5 does in memory. transformers 5's in-memory form (also in checkpoints saved with
# ``save_original_format=False``) fuses the experts: ``mlp.experts.gate_up_proj`` [E, 2F, D]
# (gate rows, then up rows) and ``mlp.experts.down_proj`` [E, D, F]; both forms load.
_HUB = re.compile(r"(model\.layers\.\d+)\.block_sparse_moe\.")
_FUSED = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def is_fused_expert_key(key: str) -> bool:
    return _FUSED.match(key) is not None


def from_hf_name(key: str) -> str:
    return _HUB.sub(r"\1.mlp.", key)


def to_hf_name(key: str) -> str:
    """inferlab's name of an MoE tensor -> the hub's (``block_sparse_moe``); other names unchanged."""
    return re.sub(r"(model\.layers\.\d+)\.mlp\.(gate|experts)\.", r"\1.block_sparse_moe.\2.", key)


def split_fused(key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """One fused expert tensor -> inferlab's per-expert ``w1``/``w3`` (gate_up) or ``w2`` (down)."""
    prefix, kind = _FUSED.match(key).groups()
    out = {}
    for e, t in enumerate(tensor.unbind(0)):
        if kind == "down_proj":
            out[f"{prefix}.{e}.w2.weight"] = t
        else:
            gate, up = t.chunk(2, dim=0)
            out[f"{prefix}.{e}.w1.weight"], out[f"{prefix}.{e}.w3.weight"] = gate, up
    return out
