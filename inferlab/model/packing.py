"""Packed projections: one GEMM where a layer has several that read the same input.

q, k and v all multiply the same normed hidden state, and so do the MLP's gate and up. Stacking
their weight rows turns three (two) small matrix products into one larger one, and a decode step
pays per-op overhead (dispatch, thread wake-up, one pass over ``x``) once instead of three times.
nano-vllm builds its model this way (``QKVParallelLinear``, ``MergedColumnParallelLinear``);
vLLM calls the mapping ``packed_modules_mapping``.

Here the model keeps its HF-named projections (checkpoints, quantizers and the GGUF writer see
``q_proj``, ``k_proj`` ...), and :func:`pack_projections` stacks them after loading: the packed
tensor owns the memory and each projection's weight becomes a view of its rows, so nothing is
stored twice. Every format whose tensors are laid out by output row packs: fp32/fp16 ``nn.Linear``,
INT8, INT4 (GPTQ and AWQ load as INT4), Q8_0/Q4_0/Q4_1/Q4_K, and NF4 where its blocks do not straddle
rows (bitsandbytes keeps its codes and absmax flat, over the flattened weight: when the block size
divides the input width, they are rows too). Act-order INT4 (a column permutation per projection)
stays unpacked. If a projection is replaced or
moved later (``replace_linears``, ``.to()``), its layer notices and drops the packed copy; while a
forward hook watches a projection (calibration for GPTQ/AWQ, a probe in a notebook), the layer
calls the projections one by one so the hook sees its input.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.modules import module as _module


def _tensors(m: nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    out = {n: ("p", t) for n, t in m._parameters.items() if t is not None}
    out.update({n: ("b", t) for n, t in m._buffers.items() if t is not None})
    return out


def _rows(m: nn.Module, t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as [out_features, ...], one row per output: as it is, or (NF4's flat codes and absmax,
    where no block straddles two rows) viewed so; None where it is not laid out by output row."""
    if t.dim() and t.shape[0] == m.out_features:
        return t
    if type(m).__name__ == "NF4Linear" and t.dim() == 1 and m.in_features % m.blocksize == 0:
        return t.view(m.out_features, -1)
    return None


def _settings(m: nn.Module) -> dict:
    """The module's plain attributes other than its size (group size, bits, block type...)."""
    return {k: v for k, v in vars(m).items()
            if not k.startswith("_") and k not in ("out_features", "training") and not isinstance(v, torch.Tensor)}


def _packable(parts: list[nn.Module]) -> bool:
    first = parts[0]
    quantized = hasattr(first, "dequantize") and hasattr(first, "in_features")  # an inferlab QuantLinear
    if not (isinstance(first, nn.Linear) or quantized) or any(type(p) is not type(first) for p in parts):
        return False
    if getattr(first, "perm", None) is not None or any(p._modules for p in parts):
        return False  # act-order INT4: each projection permutes its input its own way
    if "weight" not in first._parameters and "qweight" not in first._buffers:
        return False
    ref = {n: (t, _rows(first, t)) for n, (_, t) in _tensors(first).items()}
    settings = _settings(first)
    for p in parts:
        ts = _tensors(p)
        if ts.keys() != ref.keys() or _settings(p) != settings or p.in_features != first.in_features:
            return False
        for n, (_, t) in ts.items():
            rows, (t0, rows0) = _rows(p, t), ref[n]
            if rows is None or rows0 is None or t.dim() != t0.dim() or rows.shape[1:] != rows0.shape[1:] \
                    or t.dtype != t0.dtype or t.device != t0.device:
                return False
    return True


class PackedLinear:
    """Row-stacked projections of one input, run as one module; calling it returns their outputs.

    Not an ``nn.Module`` on purpose: it is not a submodule of the layer, so ``state_dict``,
    ``parameters()`` and ``replace_linears`` see only the HF-named projections, which view its rows.
    """

    def __init__(self, parts: list[nn.Module]):
        self.sizes = [p.out_features for p in parts]
        fused = copy.deepcopy(parts[0])
        fused.out_features = sum(self.sizes)
        for name, (kind, t0) in _tensors(parts[0]).items():
            full_rows = torch.cat([_rows(p, _tensors(p)[name][1].detach()) for p in parts]).contiguous()
            full = full_rows.view(-1) if t0.dim() == 1 else full_rows  # NF4's flat buffers stay flat
            if kind == "p":
                fused._parameters[name] = nn.Parameter(full, requires_grad=False)
            else:
                fused._buffers[name] = full
            start = 0
            for p, n in zip(parts, self.sizes):
                rows = full_rows[start:start + n]
                rows = rows.view(-1) if t0.dim() == 1 else rows
                if kind == "p":
                    p._parameters[name] = nn.Parameter(rows, requires_grad=p._parameters[name].requires_grad)
                else:
                    p._buffers[name] = rows
                start += n
        self.fused = fused
        self._parts = parts
        self._ptrs = [self._ptr(p) for p in parts]

    @staticmethod
    def _ptr(part: nn.Module) -> int:
        """Where the part's main tensor (``weight`` or ``qweight``) lives: it moves if replaced."""
        t = part._parameters.get("weight")
        return (t if t is not None else part._buffers["qweight"]).data_ptr()

    def intact(self, *parts: nn.Module) -> bool:
        """Are ``parts`` still the projections this was packed from, viewing its memory?"""
        return all(p is q and self._ptr(p) == ptr for p, q, ptr in zip(parts, self._parts, self._ptrs))

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.fused(x).split(self.sizes, dim=-1)


def pack(owner: nn.Module, attr: str, parts: list[nn.Module]) -> bool:
    """Pack ``parts`` into ``owner.<attr>`` (outside its submodules); False where they cannot pack."""
    packed = PackedLinear(parts) if _packable(parts) else None
    object.__setattr__(owner, attr, packed)
    return packed is not None


# (a layer's submodule, the packed attribute, the projections it stacks): the packs every layer may hold
GROUPS = (("self_attn", "packed_qkv", ("q_proj", "k_proj", "v_proj")),
          ("mlp", "packed_gate_up", ("gate_proj", "up_proj")))


def _groups(model: nn.Module):
    """(owner, attr, parts) of every group of ``model``'s layers; a MoE layer's experts are not one."""
    for layer in model.model.layers:
        for sub, attr, names in GROUPS:
            owner = getattr(layer, sub)
            if all(hasattr(owner, n) for n in names):
                yield owner, attr, [getattr(owner, n) for n in names]


def pack_projections(model: nn.Module) -> int:
    """Pack q/k/v and gate/up in every layer of ``model``; returns how many groups were packed."""
    return sum(pack(owner, attr, parts) for owner, attr, parts in _groups(model))


def _global_hooks() -> bool:
    return bool(_module._global_forward_hooks or _module._global_forward_pre_hooks)


def ready_to_compile(model: nn.Module) -> bool:
    """Check every packed group now, eagerly (a stale one is dropped), so that a compiled forward
    can skip the checks (a graph cannot compare data pointers). False where a hook watches a
    projection: a compiled forward must not run then (the caller runs the eager one)."""
    if _global_hooks():
        return False
    for owner, attr, parts in _groups(model):
        if owner.__dict__.get(attr) is not None:
            if any(p._forward_hooks or p._forward_pre_hooks for p in parts):
                return False
            use_packed(owner, attr, *parts)
    return True


def use_packed(owner: nn.Module, attr: str, *parts: nn.Module) -> PackedLinear | None:
    """The packed module of ``owner`` if it still matches ``parts``; a stale one is dropped (freed)."""
    packed = owner.__dict__.get(attr)
    if packed is None or torch.compiler.is_compiling():
        return packed  # a compiled step: the runner checked every group before calling it
    if any(p._forward_hooks or p._forward_pre_hooks for p in parts) or _global_hooks():
        return None  # someone watches a projection (calibration, a probe): call each one, as unpacked
    if packed.intact(*parts):
        return packed
    object.__setattr__(owner, attr, None)
    return None
