"""The collectives tensor parallelism needs, counted and timed (``inferlab bench tp`` reads them).

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits every weight matrix across ``world``
processes. Each rank computes a slice, and two collectives put the slices back together:

- **all-reduce**: every rank holds a partial sum of the same tensor; afterwards every rank holds
  the total (after each row-parallel layer: ``o_proj``, ``down_proj``, a MoE block);
- **all-gather**: every rank holds a slice; afterwards every rank holds them all, concatenated
  (the vocabulary slices of the logits).

A decode step of an L-layer model makes 2L + 1 all-reduces (attention and MLP of each layer, and
the embedding) and one all-gather. On GPUs these run over NVLink (~900 GB/s) with NCCL; here over
localhost TCP with gloo, where one small all-reduce costs ~1 ms: TP on a 2-core CPU teaches
correctness, not speed.
"""
from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from inferlab.errors import InferlabError


class TensorParallelError(InferlabError):
    """What cannot run tensor-parallel, or a rank that failed (the message says what to do)."""


def sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """A bare all-reduce over the default group, in place, uncounted (a :class:`Collectives` counts)."""
    dist.all_reduce(t)
    return t


@dataclasses.dataclass
class CollectiveStats:
    """What one rank's collectives have cost so far: calls, seconds and bytes of each kind."""

    all_reduce: int = 0
    all_reduce_s: float = 0.0
    all_reduce_bytes: int = 0
    all_gather: int = 0
    all_gather_s: float = 0.0
    all_gather_bytes: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Collectives:
    """One rank's all-reduce and all-gather over its group of ``world`` ranks, counted in ``stats``.

    Each rank's model holds one (the factory hands it to every layer that talks to the others),
    and rank 0's executor keeps it, so ``inferlab bench tp`` reads the counters of the engine it
    runs and of no other."""

    def __init__(self, world: int):
        self.world = world
        self.stats = CollectiveStats()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place; returns it."""
        t0 = time.perf_counter()
        dist.all_reduce(t)
        self.stats.all_reduce += 1
        self.stats.all_reduce_s += time.perf_counter() - t0
        self.stats.all_reduce_bytes += t.numel() * t.element_size()
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``t`` along the last dimension, in rank order."""
        t0 = time.perf_counter()
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t)
        self.stats.all_gather += 1
        self.stats.all_gather_s += time.perf_counter() - t0
        self.stats.all_gather_bytes += t.numel() * t.element_size() * self.world
        return torch.cat(parts, dim=-1)
