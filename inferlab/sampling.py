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


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V], each row with its own params and generator."""
    if all(p.greedy for p in params):
        return logits.argmax(-1)
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for i, (p, g) in enumerate(zip(params, generators)):
        if p.greedy:
            out[i] = logits[i].argmax()
        else:
            out[i] = torch.multinomial(probs_from_logits(logits[i], p), 1, generator=g)[0]
    return out


def make_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
