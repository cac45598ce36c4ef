"""Tensor-parallel layers (Megatron-LM, Shoeybi et al. 2019; vLLM's names), one rank's share each.

A linear ``y = x W^T`` with ``W`` [out, in] splits two ways:

- **column-parallel**: rank r holds rows ``[r*out/N, (r+1)*out/N)`` of ``W`` and computes that
  slice of ``y`` from the whole ``x``. No communication: the output stays split. q, k, v, gate and
  up (Mixtral's w1, w3) are column-parallel, so each rank owns whole attention heads and a slice of
  the MLP's hidden units.
- **row-parallel**: rank r holds columns ``[r*in/N, (r+1)*in/N)`` and multiplies the matching
  slice of ``x`` (exactly what the column-parallel layer before it produced): each rank holds a
  partial sum of ``y``, and one all-reduce adds them up. o, down and w2 are row-parallel.

So attention and MLP each cost one all-reduce, whatever the model size. The embedding splits the
vocabulary: each rank looks up the ids it owns (zeros elsewhere) and an all-reduce sums them; the
lm_head splits it the same way, so tied weights stay one tensor per rank, and an all-gather joins
the logits. Each module knows how to cut its own slice out of a full checkpoint tensor
(``shard``), so the loader can read only that slice from disk. A module that talks to the other
ranks is given its rank's :class:`~inferlab.parallel.comm.Collectives`, which counts every call.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.parallel.comm import Collectives, TensorParallelError, sum_over_ranks

AllReduce = Callable[[torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------- the three forwards, as functions
# The modules below call these (lab 09 grades a student's version of each against them). ``all_reduce``
# is passed in so the one place a rank talks to the others is visible in the signature.

def column_parallel_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """This rank's slice of ``y = x W^T + b``: ``weight`` holds rows of W (output features), so the
    output is this rank's columns of y. No communication: the next row-parallel layer reads the slice."""
    return F.linear(x, weight, bias)


def row_parallel_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         all_reduce: AllReduce = sum_over_ranks) -> torch.Tensor:
    """``x`` is this rank's slice of the input features, ``weight`` the matching columns of W: each
    rank computes a partial sum of the whole y; ``all_reduce`` adds the ranks' partial sums. The bias
    is added once, after the sum (added before, it would count N times)."""
    y = all_reduce(F.linear(x, weight))
    return y + bias if bias is not None else y


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, start: int,
                             all_reduce: AllReduce = sum_over_ranks) -> torch.Tensor:
    """``weight`` holds rows ``[start, start + len(weight))`` of the embedding table. Each rank embeds
    the ids it owns and writes zeros for the others (an id outside the shard must not index it);
    ``all_reduce`` sums the ranks, so each position receives exactly its one owner's row."""
    mine = (ids >= start) & (ids < start + weight.shape[0])
    x = F.embedding(torch.where(mine, ids - start, 0), weight) * mine[..., None].to(weight.dtype)
    return all_reduce(x)


class ColumnParallelLinear(nn.Linear):
    """Rows ``rows = (start, end)`` of a [out, in] weight; the output stays split (gather_output=False).

    Still an ``nn.Linear`` with the local shape: packing (``inferlab.model.packing``) stacks a rank's q/k/v
    shards into one GEMM as it stacks full projections."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rows: tuple[int, int], tp_size: int):
        super().__init__(in_features, rows[1] - rows[0], bias=bias)
        self.tp_size = tp_size
        self._rows, self._full_out = rows, out_features  # private: packing compares public settings only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel_forward(x, self.weight, self.bias)

    def full_shape(self, name: str) -> tuple[int, ...]:
        return (self._full_out, self.in_features) if name == "weight" else (self._full_out,)

    def shard(self, name: str, full) -> torch.Tensor:
        """This rank's rows of the full ``weight`` or ``bias`` (a tensor or a safetensors slice)."""
        return full[self._rows[0]:self._rows[1]]


class RowParallelLinear(nn.Linear):
    """Columns ``[rank*in/N, (rank+1)*in/N)`` of the weight; forward all-reduces the partial sums,
    then adds the bias once. ``reduce_results=False`` leaves the sum to the caller (a MoE block
    reduces once after adding its experts, not once per expert)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, tp_size: int,
                 comm: Collectives, reduce_results: bool = True):
        local = in_features // tp_size
        super().__init__(local, out_features, bias=bias)
        self.tp_size, self.reduce_results, self.comm = tp_size, reduce_results, comm
        self._cols, self._full_in = (rank * local, (rank + 1) * local), in_features

    def full_shape(self, name: str) -> tuple[int, ...]:
        return (self.out_features, self._full_in) if name == "weight" else (self.out_features,)

    def shard(self, name: str, full) -> torch.Tensor:
        return full[:, self._cols[0]:self._cols[1]] if name == "weight" else full[:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reduce_results and self.tp_size > 1:
            return row_parallel_forward(x, self.weight, self.bias, self.comm.all_reduce)
        y = F.linear(x, self.weight)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Rows ``[rank*per, (rank+1)*per)`` of the [vocab, dim] table, ``per = ceil(vocab / N)`` (the
    last rank's padding rows are zeros). Each rank embeds the ids it owns; an all-reduce adds them."""

    def __init__(self, num_embeddings: int, embedding_dim: int, rank: int, tp_size: int, comm: Collectives):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.tp_size = num_embeddings, embedding_dim, tp_size
        self.comm = comm
        self.per_rank = -(-num_embeddings // tp_size)
        self.start = rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim))

    def full_shape(self, name: str) -> tuple[int, ...]:
        return (self.num_embeddings, self.embedding_dim)

    def shard(self, name: str, full) -> torch.Tensor:
        end = min(self.start + self.per_rank, self.num_embeddings)
        rows = full[self.start:end] if end > self.start else full[0:0]
        pad = self.per_rank - rows.shape[0]
        return torch.cat([rows, rows.new_zeros(pad, rows.shape[1])]) if pad else rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        return vocab_parallel_embedding(ids, self.weight, self.start, self.comm.all_reduce)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection over this rank's vocabulary rows (the same rows as the embedding, so
    tying shares one tensor); an all-gather joins the ranks' logits and drops the padding."""

    def __init__(self, in_features: int, out_features: int, rank: int, tp_size: int, comm: Collectives):
        super().__init__(out_features, in_features, rank, tp_size, comm)
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        if self.tp_size == 1:
            return logits[..., :self.num_embeddings]
        return self.comm.all_gather(logits)[..., :self.num_embeddings]


# ---------------------------------------------------------------- quantized linears
# A quantized linear keeps the layout of its weight: codes and scales run by output row, so a
# column-parallel rank keeps whole rows. Row-parallel cuts each row: INT8's codes column by column
# (one scale per output row stays whole), INT4's codes two per byte and its scales by whole groups;
# a group cut across two ranks would need a scale on each, which the checkpoint does not hold.
# The module keeps its own class (packing and the fast paths see what they always see); ``_tp``
# says which slice it holds, and a row-parallel one all-reduces its output in a forward hook.

SHARDABLE_METHODS = ("int8", "int4")  # per row (int8) or per group of a row (int4): cut by rows or whole groups


def _check_shardable(module: nn.Module) -> None:
    method = getattr(module, "method", type(module).__name__)
    if method not in SHARDABLE_METHODS:
        raise TensorParallelError(f"{method} linears do not shard (their blocks run over the flattened "
                                       "weight): use int8 or int4, or tensor_parallel_size=1")
    if getattr(module, "perm", None) is not None:
        raise TensorParallelError("act-order INT4 (GPTQ desc_act) permutes each row's inputs: it does not "
                                       "shard by columns; quantize without act order, or use tensor_parallel_size=1")


def quantized_column(module: nn.Module, rows: tuple[int, int], full_out: int) -> nn.Module:
    _check_shardable(module)
    module._tp = ("column", rows, full_out)
    return module


def quantized_row(module: nn.Module, rank: int, tp_size: int, comm: Collectives,
                  reduce_results: bool = True) -> nn.Module:
    _check_shardable(module)
    group = getattr(module, "group_size", None)
    if group is not None and module.in_features % group:
        raise TensorParallelError(f"a group of {group} inputs would be cut across ranks ({module.in_features} "
                                       f"inputs each): use a group size that divides {module.in_features}, "
                                       "or fewer ranks")
    module._tp = ("row", rank, tp_size)
    if reduce_results and tp_size > 1:
        module.register_forward_hook(lambda mod, args, out: comm.all_reduce(out))
    return module


def quantized_full_shape(module: nn.Module, local: tuple[int, ...]) -> tuple[int, ...]:
    kind, *rest = module._tp
    if kind == "column":
        return (rest[1],) + tuple(local[1:])
    return tuple(local[:1]) + (local[1] * rest[1],) + tuple(local[2:]) if len(local) > 1 else tuple(local)


def shard_quantized(module: nn.Module, local: tuple[int, ...], full) -> torch.Tensor:
    """This rank's slice of a quantized linear's buffer (``local``: its shape on this rank)."""
    kind, *rest = module._tp
    if kind == "column":
        return full[rest[0][0]:rest[0][1]]
    if len(local) == 1:
        return full[:]  # one scale per output row: whole
    start = rest[0] * local[1]
    return full[:, start:start + local[1]]
