"""AWQ, activation-aware weight quantization (Lin et al. 2023).

A few input channels carry much larger activations than the rest; the weights that multiply them
matter most ("salient"). Instead of keeping them in high precision, AWQ scales them up before
quantizing (their relative rounding error shrinks) and divides the input by the same factor,
which costs nothing at run time because the division is folded into the operation that produces
the input (an RMSNorm's weight, or the rows of the previous linear):

    y = W x = (W diag(s)) (diag(s)^-1 x)        s = mean|x|^alpha, normalised,  alpha in [0, 1)

alpha is found by a grid search (20 points) that minimises the layer's output error
||Q(W diag(s)) (diag(s)^-1 X) - W X||^2 on calibration inputs X. Then a second search shrinks each
group's clipping range (max |w| times 1.0, 0.95, ... 0.55) where that lowers the group's output
error. The weights are finally rounded to nearest, group-wise, asymmetric (INT4 g128).

Where the scale is folded, per decoder layer:
    q, k, v    <- input_layernorm.weight         gate, up  <- post_attention_layernorm.weight
    down       <- up_proj's output rows          o         <- v_proj's rows, only when v's output
                                                              is o's input (no GQA), as in AutoAWQ
"""
from __future__ import annotations

import torch

from inferlab.quant.int4 import group_qparams, quantize_codes


def fake_quant(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Round-to-nearest group-wise asymmetric, returned dequantized (same shape as ``w``)."""
    out, cols = w.shape
    g = w.view(out, cols // group_size, group_size)
    scale, zero = group_qparams(g, bits)
    scale, zero = scale[..., None], zero[..., None]
    return ((quantize_codes(g, scale, zero, bits) - zero) * scale).view(out, cols)


@torch.no_grad()
def search_scale(x: torch.Tensor, x_mean: torch.Tensor, weights: list[torch.Tensor], bits: int,
                 group_size: int, n_grid: int = 20) -> tuple[torch.Tensor, float, list[float]]:
    """Best per-input-channel scale s for the linears ``weights`` that share the input ``x`` [N, in].
    Returns (s, best alpha, the loss at each alpha)."""
    W = torch.cat([w.float() for w in weights], 0)
    ref = x @ W.T
    best, best_s, best_alpha, losses = float("inf"), None, 0.0, []
    for r in range(n_grid):
        alpha = r / n_grid
        s = x_mean.pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        loss = (x @ (fake_quant(W * s, bits, group_size) / s).T - ref).pow(2).mean().item()
        losses.append(loss)
        if loss < best:
            best, best_s, best_alpha = loss, s, alpha
    return best_s, best_alpha, losses


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, n_grid: int = 20,
                max_shrink: float = 0.5) -> torch.Tensor:
    """Per (row, group) clipping threshold minimising that group's output error on ``x`` [N, in]."""
    out, cols = w.shape
    ng = cols // group_size
    wg = w.float().view(out, ng, group_size)
    xg = x.float().view(-1, ng, group_size).permute(1, 2, 0)  # [ng, G, N]
    ref = torch.bmm(wg.transpose(0, 1), xg)  # [ng, out, N]: each group's share of the output
    max_org = wg.abs().amax(-1, keepdim=True)  # [out, ng, 1]
    best_max, best_err = max_org.clone(), torch.full((out, ng, 1), float("inf"))
    for i in range(int(max_shrink * n_grid)):
        max_val = max_org * (1 - i / n_grid)
        cur = torch.maximum(torch.minimum(wg, max_val), -max_val)
        q = fake_quant(cur.view(out, cols), bits, group_size).view(out, ng, group_size)
        err = (torch.bmm(q.transpose(0, 1), xg) - ref).pow(2).mean(-1).T[..., None]  # [out, ng, 1]
        better = err < best_err
        best_err, best_max = torch.where(better, err, best_err), torch.where(better, max_val, best_max)
    return torch.maximum(torch.minimum(wg, best_max), -best_max).view(out, cols)


def scale_groups(layer) -> list[tuple[object, list[str]]]:
    """(where 1/s is folded, [linears that share that input]) for one decoder layer."""
    attn, mlp = layer.self_attn, layer.mlp
    groups = [(layer.input_layernorm, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
              (layer.post_attention_layernorm, ["mlp.gate_proj", "mlp.up_proj"]),
              (mlp.up_proj, ["mlp.down_proj"])]
    if attn.v_proj.weight.shape == attn.o_proj.weight.shape:
        groups.append((attn.v_proj, ["self_attn.o_proj"]))
    return groups


@torch.no_grad()
def apply_scale(prev, linears, s: torch.Tensor) -> None:
    """W <- W diag(s) for each linear; the producer of their input divides by s."""
    for lin in linears:
        lin.weight.mul_(s.to(lin.weight.dtype)[None, :])
    if isinstance(prev, torch.nn.Linear):
        prev.weight.div_(s.to(prev.weight.dtype)[:, None])
        if prev.bias is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    else:  # RMSNorm
        prev.weight.div_(s.to(prev.weight.dtype))
