"""Sharded loading: each rank reads only its slice of every tensor from the safetensors files.

``safe_open(...).get_slice(key)`` maps the file and reads just the rows (or columns) asked for,
so a rank's peak memory is about 1/N of the model, not the whole model then a cut. A 70B model
in fp16 (140 GB) on 8 GPUs puts ~17.5 GB of weights on each. The layers say what they hold
(``shard``); the loader checks each full tensor's shape against the config before cutting.
"""
from __future__ import annotations

import os

import torch
from safetensors import safe_open

from inferlab.model import moe
from inferlab.device import default_device, default_dtype
from inferlab.errors import CheckpointError
from inferlab.model.loader import _quantization_config, _weight_files, assemble, load_config, resolve_model_path
from inferlab.model import CausalLM
from inferlab.model.llama import on_meta
from inferlab.parallel.comm import Collectives, TensorParallelError
from inferlab.parallel.factory import TensorParallelFactory
from inferlab.parallel.layers import SHARDABLE_METHODS, quantized_full_shape, shard_quantized


def build_shard(config, rank: int, world: int, quantized=None, comm: Collectives | None = None) -> CausalLM:
    """Rank ``rank``'s share of the model (on the current default device; meta to load into), its
    layers talking to the other ranks through ``comm`` (a new :class:`Collectives` when not given)."""
    factory = TensorParallelFactory(config, rank, world, quantized, comm)
    model = CausalLM(config, factory)
    if world > 1:  # a MoE block adds its experts' partial sums, then reduces once
        for block in moe.moe_blocks(model):
            block.register_forward_hook(lambda module, args, out: factory.comm.all_reduce(out))
    return model


def load_shard(path_or_id: str | os.PathLike, rank: int, world: int, device=None, dtype=None,
               comm: Collectives | None = None):
    """Return ``(model, tokenizer)`` for rank ``rank`` of ``world``, reading only its slices; its
    collectives are ``comm`` (pass one to read its counters) or a new one."""
    folder = resolve_model_path(path_or_id)
    config = load_config(folder)
    qcfg = _quantization_config(folder)
    quantized = None
    if qcfg is not None:
        if qcfg["quant_method"] not in SHARDABLE_METHODS:
            raise TensorParallelError(f"{folder} is {qcfg['quant_method']}-quantized; only int8 and int4 folders "
                                      "shard (hub GPTQ/AWQ layouts and block formats do not): use "
                                      "tensor_parallel_size=1")
        from inferlab.quant.checkpoint import linear_factory
        quantized = linear_factory(qcfg)
    device = torch.device(device or default_device())
    dtype = dtype or default_dtype(device)
    with on_meta():
        model = build_shard(config, rank, world, quantized, comm)
    state = model.checkpoint_state_dict()
    params = {k for k, _ in model.named_parameters()}
    modules = dict(model.named_modules())

    def cut(name: str, full) -> torch.Tensor:
        """Check the full shape, read this rank's slice, convert it."""
        owner, _, leaf = name.rpartition(".")
        module = modules[owner]
        full_shape = tuple(full.get_shape() if hasattr(full, "get_shape") else full.shape)
        local = tuple(state[name].shape)
        if hasattr(module, "_tp"):  # a quantized linear's share
            want, t = quantized_full_shape(module, local), lambda: shard_quantized(module, local, full)
        elif hasattr(module, "shard"):
            want, t = module.full_shape(leaf), lambda: module.shard(leaf, full)
        else:
            want, t = local, lambda: full[:]
        if full_shape != tuple(want):
            raise CheckpointError(f"{folder}: weight {name} has shape {full_shape}, the config implies {tuple(want)}")
        # own memory, not a view of the memory-mapped file: a view keeps the whole file mapped
        return t().to(device=device, dtype=dtype if name in params else state[name].dtype, copy=True)

    tensors, unexpected = {}, []
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            keys = list(f.keys())
        for key in keys:
            if key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and config.tie_word_embeddings):
                continue
            # the file is mapped anew for each tensor: the pages a cut reads (all of them for a
            # column cut, which reads a piece of every row) are let go before the next one
            with safe_open(str(file), framework="pt") as f:
                if config.num_local_experts and moe.is_fused_expert_key(key):  # read whole, then cut
                    for name, part in moe.split_fused(key, f.get_tensor(key)).items():
                        tensors[name] = cut(name, part)
                    continue
                name = moe.from_hf_name(key) if config.num_local_experts else key
                if name not in state:
                    unexpected.append(key)
                    continue
                tensors[name] = cut(name, f.get_slice(key))
    return assemble(model, tensors, state.keys(), unexpected, folder, device)
