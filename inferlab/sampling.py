"""Sampling parameters (vLLM's names) and the token sampler.

Order of operations, as in HF and vLLM: temperature scales the logits, top-k keeps the k most
likely tokens, top-p (nucleus, Holtzman et al. 2019) keeps the smallest set whose probability
reaches p, then one token is drawn. Temperature 0 means greedy (argmax).
"""
from __future__ import annotations

import dataclasses
import enum

import torch


class RequestOutputKind(enum.IntEnum):
    """What each of a request's outputs carries (vLLM's names). CUMULATIVE: the text and token ids
    so far, every step; DELTA: only what is new since the previous output (a stream's cost stays
    per token, not per token so far); FINAL_ONLY: one output, when the request finishes."""
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclasses.dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) disables top-k
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1  # completions per prompt (parallel sampling: the engine forks them, copy-on-write)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not self.temperature >= 0:  # NaN fails this too
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if isinstance(self.output_kind, str):
            if self.output_kind.upper() not in RequestOutputKind.__members__:
                raise ValueError(f"output_kind must be one of {', '.join(RequestOutputKind.__members__)}, "
                                 f"got {self.output_kind!r}")
            self.output_kind = RequestOutputKind[self.output_kind.upper()]
        self.output_kind = RequestOutputKind(self.output_kind)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, top-k and top-p applied to ``logits`` [..., V]; removed entries become -inf."""
    logits = logits / max(temperature, 1e-6)
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p  # keep the token that crosses p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from (one-hot for greedy). Speculative decoding's
    rejection sampler needs exactly this distribution for the target and the draft."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    return filter_logits(logits.float(), params.temperature, params.top_k, params.top_p).softmax(-1)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V], each row with its own params and generator.

    One pass for the whole batch (vLLM's and gpt-fast's sampler): per-row temperature, top-k and
    top-p are tensors, and the draw is the exponential race: with E_i ~ Exp(1) independent,
    ``argmax_i p_i / E_i`` is distributed as p, so one argmax replaces a multinomial per row.
    Nothing sorts the vocabulary: rows with a top-k work on their k best tokens from one ``topk``;
    rows with only a top-p find the nucleus by bisecting a probability threshold. The noise comes
    from the default generator in one call, except for seeded rows, which draw theirs (over the
    whole vocabulary, in token order) from their own generator: a seeded request gives the same
    tokens whatever else shares its batch.
    """
    B, V = logits.shape
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return _argmax(logits)
    groups = {"plain": [], "top_k": [], "top_p": []}
    for i in rows:
        p = params[i]
        groups["top_k" if 0 < p.top_k < V else "top_p" if p.top_p < 1.0 else "plain"].append(i)
    out = _argmax(logits) if len(rows) < B else torch.empty(B, dtype=torch.long, device=logits.device)
    for kind, group in groups.items():
        if not group:
            continue
        sub = logits if len(group) == B else logits[group]
        sub = sub.float() / _col([params[i].temperature for i in group], logits).clamp(min=1e-6)
        gens = [generators[i] for i in group]
        if kind == "top_k":
            probs, idx = top_k_probs(sub, [params[i] for i in group])
            tokens = idx.gather(1, _argmax(probs / exponential_noise(probs.shape, sub, gens, idx))[:, None])[:, 0]
        else:
            probs = sub.softmax(-1) if kind == "plain" else top_p_probs(sub, [params[i].top_p for i in group])
            tokens = draw(probs, gens)
        if len(group) == B:
            return tokens
        out[group] = tokens
    return out


def _argmax(x: torch.Tensor) -> torch.Tensor:
    return x.max(-1).indices  # the same index as argmax (the first maximum), several times faster on a CPU


def _col(values, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, device=like.device)[:, None]


def draw(probs: torch.Tensor, generators) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] by the exponential race: argmax(p / E), E ~ Exp(1)."""
    return _argmax(probs / exponential_noise(probs.shape, probs, generators))


def exponential_noise(shape, like: torch.Tensor, generators, index: torch.Tensor | None = None) -> torch.Tensor:
    """Exp(1) noise [B, n] as -log(U) (several times faster than ``exponential_`` on a CPU); seeded rows
    draw a vocabulary-wide row from their own generator, gathered by ``index``."""
    noise = torch.rand(shape, device=like.device).log_().neg_()
    for j, g in enumerate(generators):
        if g is not None:
            row = torch.rand(like.shape[-1], device=like.device, generator=g).log_().neg_()
            noise[j] = row if index is None else row[index[j]]
    return noise.clamp_(min=1e-20)


def top_p_probs(logits: torch.Tensor, top_p: list[float], steps: int = 24) -> torch.Tensor:
    """Softmax of temperature-scaled ``logits`` [B, V], zero outside each row's nucleus (top-p < 1).

    The nucleus is every token at least as likely as the token that crosses p in sorted order.
    Instead of sorting, bisect the threshold t: the mass of {probs >= t} falls as t rises, and the
    nucleus threshold is the largest t whose mass still reaches p. ``steps`` halvings bring t within
    pmax / 2^steps of it; the smallest probability above the final bound is then the threshold itself.
    Tokens tied with the crossing token all stay (a sort would keep an arbitrary part of the tie)."""
    probs = logits.softmax(-1)
    p = _col(top_p, logits)
    pmax = probs.amax(-1, keepdim=True)
    zero = torch.zeros((), device=probs.device)

    def mass(t):
        return torch.where(probs >= t, probs, zero).sum(-1, keepdim=True)
    lo, hi = torch.zeros_like(pmax), pmax
    for _ in range(steps):
        mid = (lo + hi) / 2
        ok = mass(mid) >= p
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    t = torch.where(probs >= lo, probs, torch.full((), float("inf"), device=probs.device)).amin(-1, keepdim=True)
    return probs.masked_fill(probs < t, 0)


def top_k_probs(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """For temperature-scaled ``logits`` [B, V] whose rows all have a top-k: (probabilities [B, K],
    token ids [B, K]) of each row's K best tokens after its top-k and then its top-p, unnormalised,
    zero where filtered out (K: the largest top-k, plus one to see a tie at the edge)."""
    V = logits.shape[-1]
    ks = [p.top_k for p in params]
    K = min(max(ks) + 1, V)
    vals, idx = torch.topk(logits, K, dim=-1)
    k = torch.tensor(ks, device=logits.device)[:, None]
    kth = vals.gather(1, k - 1)
    if (kth == vals[:, -1:]).any():  # rare: a tie at the k-th value may go on past the candidates
        vals, idx = torch.sort(logits, dim=-1, descending=True)
        kth = vals.gather(1, k - 1)
    probs = vals.masked_fill(vals < kth, float("-inf")).softmax(-1)  # top-k: ties at the k-th stay
    p = _col([q.top_p for q in params], logits)
    drop = ((probs.cumsum(-1) - probs) >= p) & (p < 1.0)  # top-p on what top-k kept; keep the crossing token
    return probs.masked_fill(drop, 0), idx


def make_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
