"""Sampling parameters (vLLM's names) and the token sampler.

Order of operations, as in HF and vLLM: temperature scales the logits, top-k keeps the k most
likely tokens, top-p (nucleus, Holtzman et al. 2019) keeps the smallest set whose probability
reaches p, then one token is drawn. Temperature 0 means greedy (argmax).
"""
from __future__ import annotations

import dataclasses

import torch


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

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
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


CANDIDATES = 256  # top-p without top-k first looks at this many tokens (all of them if p is not reached)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V], each row with its own params and generator.

    One pass for the whole batch (vLLM's and gpt-fast's sampler): per-row temperature, top-k and
    top-p are tensors, and the draw is the exponential race: with E_i ~ Exp(1) independent,
    ``argmax_i p_i / E_i`` is distributed as p, so one argmax replaces a multinomial per row.
    Rows that filter (top-k, top-p) work on their few best candidates from one ``topk`` instead
    of sorting the vocabulary. The noise comes from the default generator in one call, except for
    seeded rows, which draw theirs (over the whole vocabulary, in token order) from their own
    generator: a seeded request gives the same tokens whatever else shares its batch.
    """
    B, V = logits.shape
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return _argmax(logits)
    plain = [i for i in rows if not 0 < params[i].top_k < V and params[i].top_p >= 1.0]
    filtered = [i for i in rows if 0 < params[i].top_k < V or params[i].top_p < 1.0]
    out = _argmax(logits) if len(rows) < B else torch.empty(B, dtype=torch.long, device=logits.device)
    for group, draw in ((plain, _draw_plain), (filtered, _draw_filtered)):
        if group:
            sub = logits if len(group) == B else logits[group]
            sub = sub.float() / _col([params[i].temperature for i in group], logits).clamp(min=1e-6)
            tokens = draw(sub, [params[i] for i in group], [generators[i] for i in group])
            if len(group) == B:
                return tokens
            out[group] = tokens
    return out


def _argmax(x: torch.Tensor) -> torch.Tensor:
    return x.max(-1).indices  # the same index as argmax (the first maximum), several times faster on a CPU


def _col(values, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, device=like.device)[:, None]


def _noise(shape, like: torch.Tensor, generators, index: torch.Tensor | None = None) -> torch.Tensor:
    """Exp(1) noise [B, n] as -log(U) (several times faster than ``exponential_`` on a CPU); seeded rows
    draw a vocabulary-wide row from their own generator, gathered by ``index``."""
    noise = torch.rand(shape, device=like.device).log_().neg_()
    for j, g in enumerate(generators):
        if g is not None:
            row = torch.rand(like.shape[-1], device=like.device, generator=g).log_().neg_()
            noise[j] = row if index is None else row[index[j]]
    return noise.clamp_(min=1e-20)


def _draw_plain(logits: torch.Tensor, params, generators) -> torch.Tensor:
    return _argmax(logits.softmax(-1) / _noise(logits.shape, logits, generators))


def _draw_filtered(logits: torch.Tensor, params, generators) -> torch.Tensor:
    probs, idx = candidate_probs(logits, params)
    choice = _argmax(probs / _noise(probs.shape, logits, generators, idx))
    return idx.gather(1, choice[:, None])[:, 0]


def candidate_probs(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """For temperature-scaled ``logits`` [B, V]: (probabilities [B, K], token ids [B, K]) of each row's
    best K tokens after its top-k and top-p, unnormalised; zero where filtered out. Scattered back to
    the vocabulary and normalised, row i is ``probs_from_logits`` of row i (up to rounding)."""
    V = logits.shape[-1]
    ks = [p.top_k if 0 < p.top_k < V else V for p in params]
    K = max(k for k in ks if k < V) if min(ks) < V else 0
    if max(ks) == V:  # some row has top-p only: look at CANDIDATES tokens first
        K = max(K, min(CANDIDATES, V))
    K = min(K + 1, V)  # one more: a tie at the k-th value past the candidates must be seen
    vals, idx = torch.topk(logits, K, dim=-1)
    k = torch.tensor(ks, device=logits.device)
    kth = vals.gather(1, (k.clamp(max=K) - 1)[:, None])
    has_k = (k < V)[:, None]
    # top-p is measured on the distribution after top-k: over the kept set where there is a top-k,
    # over the whole vocabulary where there is none
    lse = torch.where(has_k, vals.masked_fill(vals < kth, float("-inf")).logsumexp(-1, keepdim=True),
                      logits.logsumexp(-1, keepdim=True))
    vals = vals.masked_fill(has_k & (vals < kth), float("-inf"))
    probs = (vals - lse).exp()
    p = _col([q.top_p for q in params], logits)
    cum = probs.cumsum(-1)
    tie_at_edge = (has_k & (kth == vals[:, -1:])).any()  # the k-th value may go on past the candidates
    if K < V and (tie_at_edge or ((~has_k) & (p < 1.0) & (cum[:, -1:] < p)).any()):
        vals, idx = torch.sort(logits, dim=-1, descending=True)  # rare: the candidates do not suffice
        probs = torch.softmax(logits, -1).gather(1, idx)
        kth = vals.gather(1, (k - 1)[:, None])
        probs = probs.masked_fill(vals < kth, 0)
        probs = probs / probs.sum(-1, keepdim=True)
        cum = probs.cumsum(-1)
    drop = ((cum - probs) >= p) & (p < 1.0)  # keep the token that crosses p
    return probs.masked_fill(drop, 0), idx


def make_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
