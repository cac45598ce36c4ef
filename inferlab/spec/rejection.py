"""Exact rejection sampling for speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

A proposer guesses k tokens x_1..x_k, each drawn from its distribution q_j (a draft model), or
chosen with no distribution at all (prompt lookup, Medusa's argmax). The target scores all k+1
positions in one forward, giving p_1..p_{k+1}. Walking left to right:

- x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j));
- at the first rejection, one token is drawn from the residual norm(max(0, p_j - q_j)) and the
  step ends;
- if all k are accepted, a bonus token is drawn from p_{k+1}.

Why the output is exactly the target's: a token y comes out of position j either as an accepted
guess, with probability q(y) min(1, p(y)/q(y)) = min(p, q)(y), or from the residual, with
probability (1 - sum_x min(p, q)(x)) * max(0, p - q)(y) / Z. Since Z = sum max(0, p - q) =
1 - sum min(p, q), the two add up to min(p, q)(y) + max(0, p - q)(y) = p(y).

A proposer with no distribution is the case q = one-hot(x): x is accepted with probability
p(x), and a rejection draws from p with x removed. For a greedy request p is one-hot at the
argmax, so the rule becomes "accept while the guess equals the argmax, then emit the argmax".
"""
from __future__ import annotations

import torch

from inferlab.sampling import draw, uniforms as draw_uniforms


def recovered_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) row by row: what a rejection samples from. Where p <= q everywhere
    (a rejection of probability zero that float rounding still allowed), fall back to p."""
    residual = (p - q).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(1e-30), p)


def rejection_sample(draft_token_ids: list[list[int]], target_probs: torch.Tensor,
                     draft_probs: torch.Tensor | None = None,
                     generators: list[torch.Generator | None] | None = None,
                     uniforms: torch.Tensor | None = None) -> list[list[int]]:
    """Verify every sequence's guesses at once; returns each sequence's emitted tokens (the
    accepted guesses, then one recovered or bonus token: between 1 and k_i + 1 tokens).

    ``draft_token_ids[i]``: sequence i's k_i guesses (k_i may be 0: plain decoding).
    ``target_probs``: [sum(k_i + 1), V], each sequence's k_i + 1 rows in order (vLLM's flat
    layout), the distributions the request samples from (``probs_from_logits``).
    ``draft_probs``: [sum(k_i), V] the proposer's q for each guess, or None for a proposer with
    no distribution (the deterministic rule above).
    ``uniforms``: [B, max k] the acceptance draws, for tests; drawn here when None.
    """
    b = len(draft_token_ids)
    gens = list(generators) if generators is not None else [None] * b
    device = target_probs.device
    k = torch.tensor([len(x) for x in draft_token_ids], device=device)
    width = max(int(k.max()) if b else 0, 1)
    if target_probs.shape[0] != int(k.sum()) + b:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows; the guesses need "
                         f"sum(k_i + 1) = {int(k.sum()) + b}")
    if draft_probs is not None and draft_probs.shape[0] != int(k.sum()):
        raise ValueError(f"draft_probs has {draft_probs.shape[0]} rows; the guesses need {int(k.sum())}")
    # Padded [B, width] views of the guesses and of where each guess's rows live in the flat layout.
    pos = torch.arange(width, device=device)
    valid = pos[None, :] < k[:, None]
    ids = torch.zeros(b, width, dtype=torch.long, device=device)
    if int(k.sum()):
        ids[valid] = torch.tensor([t for x in draft_token_ids for t in x], device=device)
    t_start = torch.cumsum(k + 1, 0) - (k + 1)  # first target row of each sequence
    q_start = torch.cumsum(k, 0) - k
    t_rows = (t_start[:, None] + pos[None, :]).clamp_max(target_probs.shape[0] - 1)
    p_guess = target_probs[t_rows, ids]
    if draft_probs is None:
        q_guess = torch.ones_like(p_guess)
    else:
        q_rows = (q_start[:, None] + pos[None, :]).clamp(0, max(draft_probs.shape[0] - 1, 0))
        q_guess = draft_probs[q_rows, ids] if draft_probs.shape[0] else torch.ones_like(p_guess)
    u = uniforms if uniforms is not None else draw_uniforms(b, width, gens, device)
    accepted = (u[:, :width] * q_guess < p_guess) & valid  # u < p/q, without dividing by q
    n_acc = accepted.long().cumprod(1).sum(1)  # guesses accepted before the first rejection
    # The last token: from the residual at the first rejection, or the bonus row when all passed.
    last_p = target_probs[t_start + n_acc]
    rejected = n_acc < k
    if bool(rejected.any()):
        j = n_acc.clamp_max(width - 1)
        guess = ids[torch.arange(b, device=device), j]
        if draft_probs is None:
            q_last = torch.nn.functional.one_hot(guess, target_probs.shape[-1]).to(last_p.dtype)
        else:
            q_last = draft_probs[(q_start + j).clamp(0, max(draft_probs.shape[0] - 1, 0))]
        last_p = torch.where(rejected[:, None], recovered_probs(last_p, q_last), last_p)
    final = draw(last_p, gens)  # one categorical draw per row; seeded rows use their own generator
    n_list, f_list = n_acc.tolist(), final.tolist()
    return [list(x[:n]) + [f] for x, n, f in zip(draft_token_ids, n_list, f_list)]


def greedy_verify(draft_token_ids: list[list[int]], target_argmax: torch.Tensor) -> list[list[int]]:
    """The greedy case of :func:`rejection_sample` without building one-hot distributions: keep
    the guesses while they equal the target's argmax, then emit the argmax at the first mismatch
    (or the bonus position). ``target_argmax``: [sum(k_i + 1)] in the same flat layout."""
    best = target_argmax.tolist()
    out, row = [], 0
    for guesses in draft_token_ids:
        n = 0
        while n < len(guesses) and guesses[n] == best[row + n]:
            n += 1
        out.append(list(guesses[:n]) + [best[row + n]])
        row += len(guesses) + 1
    return out


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one verify step emits when each guess is accepted with probability ``alpha``
    independently: (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def alpha_from_tokens_per_step(tokens_per_step: float, k: int) -> float:
    """The per-position acceptance alpha whose ``expected_tokens_per_step(alpha, k)`` equals the
    measured mean (bisection; the function rises with alpha). This is the alpha of Leviathan's
    formula; the share of guesses kept, accepted / proposed, is lower whenever k > 1."""
    lo, hi = 0.0, 1.0
    target = min(max(tokens_per_step, 1.0), k + 1.0)
    if target >= k + 1.0:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < target else (lo, mid)
    return (lo + hi) / 2


def predicted_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """Leviathan's wall-clock speedup: tokens per step over the step's cost in target forwards,
    (1 - alpha^(k+1)) / ((1 - alpha)(k c + v)), with c the cost of one draft forward and v the
    cost of the (k+1)-token verify forward, both relative to one 1-token target forward."""
    return expected_tokens_per_step(alpha, k) / (k * c + v)


def mixed_speedup(f: float, length: float, kc: float, v: float, w: float = 1.0) -> float:
    """Leviathan's speedup over a mix of steps: a share f with guesses (``length`` tokens for a
    proposer's k c and a verify's v) and the rest without (1 token for w, 1 on a steady machine),
    all in plain decode steps. f = 1 gives :func:`predicted_speedup` with length for its numerator."""
    return (f * length + 1 - f) / (f * (kc + v) + (1 - f) * w)
