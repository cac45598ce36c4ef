"""The collectives tensor parallelism needs, counted and timed (``inferlab bench tp`` reads ``STATS``).

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

import time

import torch
import torch.distributed as dist

from inferlab.errors import InferlabError


class TensorParallelError(InferlabError):
    """What cannot run tensor-parallel, or a rank that failed (the message says what to do)."""

STATS = {"all_reduce": 0, "all_reduce_s": 0.0, "all_reduce_bytes": 0,
         "all_gather": 0, "all_gather_s": 0.0, "all_gather_bytes": 0}


def reset_stats() -> None:
    for k in STATS:
        STATS[k] = type(STATS[k])()


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over the ranks, in place; returns it."""
    t0 = time.perf_counter()
    dist.all_reduce(t)
    STATS["all_reduce"] += 1
    STATS["all_reduce_s"] += time.perf_counter() - t0
    STATS["all_reduce_bytes"] += t.numel() * t.element_size()
    return t


def all_gather(t: torch.Tensor, world: int) -> torch.Tensor:
    """Concatenate every rank's ``t`` along the last dimension, in rank order."""
    t0 = time.perf_counter()
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    STATS["all_gather"] += 1
    STATS["all_gather_s"] += time.perf_counter() - t0
    STATS["all_gather_bytes"] += t.numel() * t.element_size() * world
    return torch.cat(parts, dim=-1)
