"""GPTQ (Frantar et al. 2022): quantize one column at a time and push its error onto the rest.

For a linear layer with calibration inputs X, GPTQ minimises ||W X - Q(W) X||^2 row by row. The
Hessian of that objective is H = 2 X X^T (the same for every row). Quantizing column j leaves an
error e_j = (w_j - q_j) / [H^-1]_jj; the optimal update of the not-yet-quantized columns is
-e_j [H^-1]_{j, j+1:} (Optimal Brain Quantization). The paper's three tricks make this practical:

1. **Fixed order, shared H^-1**: every row quantizes columns in the same order, so one inverse serves all.
2. **Cholesky**: the rows of H^-1 that the updates need are the rows of the upper Cholesky factor of
   H^-1; with dampening (H + lambda I, lambda = 1% of mean diag) it is numerically stable.
3. **Lazy batch updates**: errors are applied inside a block of 128 columns at once, and to the
   columns after the block in one matrix product (memory-bound -> compute-bound).

Options: **act-order** (``desc_act``) quantizes columns in order of decreasing H_jj (the inputs with
the most energy first, while there is still freedom to compensate); **groups** give every
``group_size`` consecutive (in quantization order) columns their own scale and zero point, fitted
when the group's first column is reached, from the already-updated weights.
"""
from __future__ import annotations

import torch

from inferlab.quant.int4 import Int4Linear, group_qparams, pack_int4, quantize_codes


class HessianAccumulator:
    """Running H = 2/n * sum x x^T over calibration tokens (n = tokens so far)."""

    def __init__(self, in_features: int, device=None):
        self.H = torch.zeros(in_features, in_features, device=device)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        m = x.shape[0]
        self.H *= self.n / (self.n + m)
        self.n += m
        x = x.float() * (2 / self.n) ** 0.5
        self.H += x.T @ x


def gptq_quantize(W: torch.Tensor, H: torch.Tensor, bits: int = 4, group_size: int = 128,
                  act_order: bool = True, sym: bool = False, damp: float = 0.01, block_size: int = 128):
    """Quantize ``W`` [out, in] given H [in, in]. Returns (codes [out, in], scales [out, n_groups],
    zeros [out, n_groups], perm or None), columns in quantization order (``perm`` maps to the original)."""
    W = W.detach().clone().float()
    H = H.clone().float()
    cols = W.shape[1]
    group_size = cols if group_size in (-1, None) else group_size
    dead = torch.diag(H) == 0  # inputs never active: any value works, zero them
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    Q, scales, zeros = gptq_inner_loop(W, hessian_inverse_cholesky(H, damp), bits, group_size, sym, block_size)
    return Q, scales, zeros, perm


def hessian_inverse_cholesky(H: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """Upper Cholesky factor U of (H + lambda I)^-1, lambda = ``damp`` x mean diag(H).

    Row j of U, divided by U_jj, is the row of the inverse Hessian that OBQ's update for column j
    needs once columns < j are quantized: one factorisation replaces a rank-one downdate per column."""
    H = H.clone().float()
    H += damp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], device=H.device)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)


def gptq_inner_loop(W: torch.Tensor, Hinv: torch.Tensor, bits: int = 4, group_size: int = 128,
                    sym: bool = False, block_size: int = 128):
    """The column loop: quantize column j, spread its scaled error over the columns after it.
    Returns (codes [out, in] uint8, scales [out, n_groups] fp16, zeros [out, n_groups] uint8)."""
    W = W.detach().clone().float()
    cols = W.shape[1]
    block_size = max(block_size, group_size) if block_size % group_size else block_size
    Q = torch.zeros_like(W)
    scales, zeros = [], []
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            if (i1 + i) % group_size == 0:  # a new group: fit its grid on the updated weights
                scale, zero = group_qparams(W1[:, i:i + group_size], bits, sym)
                scale = scale.half().float()
                scales.append(scale), zeros.append(zero)
            w, d = W1[:, i], Hinv1[i, i]
            q = quantize_codes(w, scale, zero, bits)
            Q[:, i1 + i] = q
            err = (w - (q - zero) * scale) / d
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]  # compensate inside the block
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]  # lazy update of everything after the block
    return Q.to(torch.uint8), torch.stack(scales, 1).half(), torch.stack(zeros, 1).to(torch.uint8)


def gptq_linear(linear, H: torch.Tensor, bits: int = 4, group_size: int = 128, act_order: bool = True,
                sym: bool = False, damp: float = 0.01) -> Int4Linear:
    """An :class:`Int4Linear` from ``linear`` quantized by GPTQ (act-order keeps ``perm``)."""
    group_size = linear.in_features if group_size in (-1, None) else group_size
    q, scales, zeros, perm = gptq_quantize(linear.weight, H, bits, group_size, act_order, sym, damp)
    mod = Int4Linear(linear.in_features, linear.out_features, linear.bias is not None, group_size, bits,
                     act_order=perm is not None)
    mod.qweight, mod.scales, mod.zeros = pack_int4(q), scales, zeros
    if perm is not None:
        mod.perm = perm.to(torch.int32)
    if linear.bias is not None:
        mod.bias.data = linear.bias.detach().float().clone()
    return mod.to(linear.weight.device)
