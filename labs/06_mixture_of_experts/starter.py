"""Lab 06: mixture of experts. Write the four functions below.

A sparse MoE layer (Mixtral) has E feed-forward experts and a router. For each token the router
scores every expert, the token goes to its top-k experts, and their outputs are mixed with the
router's (renormalised) probabilities. Training adds a load-balancing loss so that the router
does not send every token to the same few experts.

Shapes: N tokens, D hidden size, E experts, F expert width, k experts per token.
Grade your work with `inferlab grade labs/06_mixture_of_experts`. Keep the names and signatures.
"""
import torch
import torch.nn.functional as F


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] -> (weights [N, top_k], experts [N, top_k]).

    softmax over all E experts (compute it in float32), keep the top_k largest probabilities and
    their expert ids (torch.topk order: largest first), then divide the kept probabilities by
    their sum so each token's weights add up to 1.
    """
    raise NotImplementedError("about 4 lines")


def expert_load(router_logits: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """The fraction of all N * top_k routing choices that went to each expert: [E], sums to 1.

    An expert nobody chose has load 0.0 (hint: torch.bincount(..., minlength=num_experts)).
    """
    raise NotImplementedError("about 3 lines: reuse route")


def load_balancing_loss(router_logits: list[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, as Mixtral trains with it, over several layers.

    Concatenate the layers' logits into one [N_total, E] tensor, then:
      probs = softmax(logits)                       (float32)
      f[e]  = (number of top_k choices of expert e) / N_total     (not differentiable)
      P[e]  = mean over tokens of probs[:, e]                      (differentiable)
      loss  = E * sum_e f[e] * P[e]
    Uniform routing gives loss == top_k; a router that prefers a few experts gives more.
    The result must carry a gradient back to the logits (through P).
    """
    raise NotImplementedError("about 6 lines")


def moe_forward(x: torch.Tensor, gate_weight: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                w3: torch.Tensor, top_k: int) -> torch.Tensor:
    """A whole sparse MoE layer: x [N, D] -> [N, D].

    gate_weight [E, D] is the router: router_logits = x @ gate_weight.T.
    Expert e is SwiGLU:  expert_e(h) = (silu(h @ w1[e].T) * (h @ w3[e].T)) @ w2[e].T
    with w1[e], w3[e] of shape [F, D] and w2[e] of shape [D, F].
    y[n] = sum over the token's top_k experts e of weight(n, e) * expert_e(x[n]).

    Run each expert once, on all the tokens routed to it (not once per token): that is what
    makes MoE fast. The grader compares your output with transformers' Mixtral block.
    """
    raise NotImplementedError("about 10 lines: route, then loop over experts")
