"""The tensor-parallel linear factory: picks column, row or replicated for each projection by its
HF name, behind the same seam as quantized linears (``inferlab.model.linear``).

    column-parallel   q_proj k_proj v_proj gate_proj up_proj  (Mixtral: experts' w1 w3)
    row-parallel      o_proj down_proj                        (Mixtral: experts' w2, reduced per block)
    vocab-parallel    embed_tokens lm_head
    replicated        the MoE router (``mlp.gate``): every rank routes the same way

Heads are never split: each rank owns ``num_attention_heads / N`` query heads and their KV heads.
With fewer KV heads than ranks (MQA on 2 ranks), each KV head is *replicated* on the ``N /
num_kv_heads`` ranks whose query heads read it, as vLLM does: no communication, a little memory.

A quantized folder shards too: each rank builds the method's own linear at its local size (INT8
by output row or input column, INT4 by whole groups; ``layers.shard_quantized``).
"""
from __future__ import annotations

from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.model.linear import default_linear
from inferlab.parallel.comm import Collectives, TensorParallelError
from inferlab.parallel.layers import (ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding,
                                     quantized_column, quantized_row)

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3")
ROW = ("o_proj", "down_proj", "w2")


def _divide(n: int, world: int, what: str) -> int:
    if n % world:
        raise TensorParallelError(f"{what} ({n}) is not divisible by tensor_parallel_size={world}: "
                                  f"choose a size that divides it")
    return n // world


class TensorParallelFactory:
    """``factory(in, out, bias, name)`` -> rank ``rank``'s share of the projection ``name``."""

    def __init__(self, config: ModelConfig, rank: int, world: int, quantized=None,
                 comm: Collectives | None = None):
        """``quantized``: the linear factory of a quantized folder (``inferlab.quant.checkpoint``);
        each rank then builds quantized linears of its local size (``layers.shard_quantized``).
        ``comm``: this rank's collectives, handed to every layer that talks to the other ranks
        (a new one when not given)."""
        if not 0 <= rank < world:
            raise TensorParallelError(f"rank {rank} is outside 0..{world - 1}")
        self.config, self.rank, self.world, self.quantized = config, rank, world, quantized
        self.comm = comm if comm is not None else Collectives(world)
        self.num_heads = _divide(config.num_attention_heads, world, "num_attention_heads")
        kv = config.num_key_value_heads
        if kv >= world:
            self.num_kv_heads = _divide(kv, world, "num_key_value_heads")
            self.kv_head = rank * self.num_kv_heads
        else:  # fewer KV heads than ranks: each rank keeps the one its query heads read
            _divide(world, kv, f"tensor_parallel_size={world} vs num_key_value_heads")
            self.num_kv_heads, self.kv_head = 1, rank * kv // world
        _divide(config.intermediate_size, world, "intermediate_size")

    def attention_heads(self, config: ModelConfig) -> tuple[int, int]:
        """(query heads, KV heads) this rank computes: the hook ``Attention`` asks for."""
        return self.num_heads, self.num_kv_heads

    def embedding(self, num_embeddings: int, embedding_dim: int) -> nn.Module:
        return VocabParallelEmbedding(num_embeddings, embedding_dim, self.rank, self.world, self.comm)

    def __call__(self, in_features: int, out_features: int, bias: bool, name: str) -> nn.Module:
        kind = name.rpartition(".")[2]
        hd = self.config.head_dim
        if name == "lm_head":
            return ParallelLMHead(in_features, out_features, self.rank, self.world, self.comm)
        q = self.quantized
        if kind in COLUMN:
            if kind in ("k_proj", "v_proj"):
                rows = (self.kv_head * hd, (self.kv_head + self.num_kv_heads) * hd)
            else:
                per = out_features // self.world
                rows = (self.rank * per, (self.rank + 1) * per)
            if q is not None:
                return quantized_column(q(in_features, rows[1] - rows[0], bias, name), rows, out_features)
            return ColumnParallelLinear(in_features, out_features, bias, rows, self.world)
        if kind in ROW:
            if bias and (kind == "w2" or q is not None):
                raise TensorParallelError(f"{name}: a row-parallel layer with a bias must add it after the "
                                          "all-reduce; only unquantized, non-expert layers do")
            if q is not None:
                try:
                    local = q(in_features // self.world, out_features, bias, name)
                except ValueError as exc:  # a group size that does not divide a rank's inputs
                    raise TensorParallelError(f"{name}: {in_features} inputs on {self.world} ranks cut a "
                                              f"quantization group ({exc}); use fewer ranks") from None
                return quantized_row(local, self.rank, self.world, self.comm, reduce_results=kind != "w2")
            return RowParallelLinear(in_features, out_features, bias, self.rank, self.world, self.comm,
                                     reduce_results=kind != "w2")
        if kind == "gate":  # the MoE router: small, replicated
            if q is not None:
                return q(in_features, out_features, bias, name)
            return default_linear(in_features, out_features, bias, name)
        raise TensorParallelError(f"no tensor-parallel rule for projection {name!r}: add it to "
                                  "inferlab.parallel.factory (COLUMN or ROW)")
