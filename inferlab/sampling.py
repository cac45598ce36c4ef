"""Sampling parameters (vLLM's names) and the token sampler.

Order of operations, as in HF and vLLM: temperature scales the logits, top-k keeps the k most
likely tokens, top-p (nucleus, Holtzman et al. 2019) keeps the smallest set whose probability
reaches p, then one token is drawn. Temperature 0 means greedy (argmax).
"""
from __future__ import annotations

import dataclasses
import enum

import torch

from inferlab.model import glue
from inferlab.structured import StructuredOutputsParams


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
    logprobs: int | None = None         # each generated token's log-prob and the top N (inferlab.logprobs)
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (None for the first)
    # a grammar the output must follow (inferlab.structured): JSON schema, regex, choice, EBNF, any JSON object
    structured_outputs: StructuredOutputsParams | None = None

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
        self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs)
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{name} must be None (off) or an integer >= 0 (how many top tokens), got {v!r}")

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

    One pass for the whole batch (as vLLM's and gpt-fast's samplers do): per-row temperature,
    top-k and top-p are tensors, and nothing sorts the vocabulary. Rows with a top-k work on their
    k best tokens from one ``topk``; rows with only a top-p draw from the whole distribution and
    reject draws outside the nucleus (:func:`draw_top_p`). Every draw is inverse-transform
    sampling (:func:`draw`): one uniform number per row, so a seeded row draws from its own
    generator and gives the same tokens whatever else shares its batch.
    """
    B, V = logits.shape
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return argmax(logits)
    groups = {"plain": [], "top_k": [], "top_p": []}
    for i in rows:
        p = params[i]
        groups["top_k" if 0 < p.top_k < V else "top_p" if p.top_p < 1.0 else "plain"].append(i)
    out = argmax(logits) if len(rows) < B else torch.empty(B, dtype=torch.long, device=logits.device)
    for kind, group in groups.items():
        if not group:
            continue
        sub = logits if len(group) == B else logits[group]
        sub = sub.float() / _col([params[i].temperature for i in group], logits).clamp(min=1e-6)
        gens = [generators[i] for i in group]
        if kind == "top_k":
            probs, idx = top_k_probs(sub, [params[i] for i in group])
            tokens = idx.gather(1, draw(probs, gens)[:, None])[:, 0]
        elif kind == "top_p":
            tokens = draw_top_p(sub.softmax(-1), _col([params[i].top_p for i in group], logits), gens)
        else:
            tokens = draw(sub.softmax(-1), gens)
        if len(group) == B:
            return tokens
        out[group] = tokens
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Greedy tokens: the first maximum of each row of x [..., V], as ``torch.argmax``. The C loop
    (``inferlab.model.glue``) where it runs; else ``max(-1).indices``, the same index."""
    out = glue.argmax(x)
    return x.max(-1).indices if out is None else out


def _col(values, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, device=like.device)[:, None]


def uniforms(rows: int, width: int, generators, device) -> torch.Tensor:
    """U(0, 1) numbers [rows, width] from the default generator in one call; a row whose generator
    is set (a seeded request) draws its own from that generator instead."""
    u = torch.rand(rows, width, device=device)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand(width, generator=g, device=device)
    return u


def draw(probs: torch.Tensor, generators) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (non-negative, not necessarily normalised) by inverse
    transform sampling: the first token whose cumulative mass exceeds u * total, u ~ U(0, 1).

    One cumulative sum and one binary search per row, and one random number: cheaper on a CPU
    than a race of V exponential draws (which a GPU sampler prefers only to avoid
    ``torch.multinomial``'s host sync; a search has none either). Tokens of probability zero are
    never drawn, because the cumulative sum does not rise at them."""
    cdf = probs.float().cumsum(-1)
    total = cdf[:, -1:]
    u = uniforms(probs.shape[0], 1, generators, probs.device) * total
    u = torch.minimum(u, total.nextafter(torch.zeros_like(total)))  # u < total: never past the end
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


def draw_top_p(probs: torch.Tensor, top_p: torch.Tensor, generators) -> torch.Tensor:
    """One token per row from ``probs`` [B, V] (normalised) restricted to each row's nucleus
    (top-p, Holtzman et al. 2019), without sorting the vocabulary.

    The nucleus is every token at least as likely as the one that crosses p in sorted order,
    which is the same as: the tokens whose strictly more likely tokens weigh less than p. So
    draw from the whole row, and accept the token when the mass above it is under p. Otherwise
    every token outside the nucleus is at most as likely as the one drawn: draw again from the
    tokens strictly more likely (the rejection-sampling top-p of FlashInfer's sampling kernels).
    Each retry draws from a set that still holds the whole nucleus, so an accepted token is
    distributed as the renormalised nucleus. The first draw lands in the nucleus with probability
    at least p, and each retry shrinks the set, so few rounds are needed, for a few rows.
    Tokens tied with the crossing one all stay (a sort would keep an arbitrary part of the tie)."""
    tokens = draw(probs, generators)
    todo = torch.arange(probs.shape[0], device=probs.device)
    rows, p = probs, top_p  # rows: each pending row's current set (the mass above a token is the same in it)
    while True:
        picked = rows.gather(1, tokens[todo][:, None])
        likelier = torch.where(rows > picked, rows, torch.zeros((), device=rows.device))
        retry = (likelier.sum(-1, keepdim=True) >= p)[:, 0]
        if not bool(retry.any()):
            return tokens
        todo, rows, p = todo[retry], likelier[retry], p[retry]
        tokens[todo] = draw(rows, [generators[i] for i in todo.tolist()])


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
