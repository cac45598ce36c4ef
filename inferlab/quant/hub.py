"""The GPTQ and AWQ checkpoint layouts of the Hugging Face hub, and their conversion to Int4Linear.

GPTQ (AutoGPTQ / GPTQModel, ``quant_method: gptq``), per linear ``prefix``:
    prefix.qweight  int32 [in * bits / 32, out]   codes along the input dim, a little-endian bit
                                                   stream: for 4 bits, word r holds rows 8r..8r+7,
                                                   row 8r + j in bits 4j..4j+3 (3 bits cross words)
    prefix.qzeros   int32 [n_groups, out * bits / 32]  zero points, packed the same way along out;
                                                   ``checkpoint_format: gptq`` (v1) stores zero - 1,
                                                   ``gptq_v2`` stores the zero itself
    prefix.scales   fp16  [n_groups, out]
    prefix.g_idx    int32 [in]                     group of each input column (act-order: not monotone)
    w[k, n] = scales[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n])

AWQ (AutoAWQ GEMM, ``quant_method: awq``, ``version: gemm``), 4-bit only:
    prefix.qweight  int32 [in, out / 8]    eight output columns per word, in the order
                                           0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds column ORDER[i])
    prefix.qzeros   int32 [n_groups, out / 8]  zero points, packed the same way
    prefix.scales   fp16  [n_groups, out]
    w[k, n] = scales[k // G, n] * (q[k, n] - zero[k // G, n])

For compute, both become Int4Linear's row-major nibbles. An act-order GPTQ checkpoint's groups are
contiguous once the input columns are sorted by g_idx, so it becomes an Int4Linear with ``perm`` =
argsort(g_idx): the input is gathered in that order, and the W4A16 kernel sees ordinary groups.
"""
from __future__ import annotations

import numpy as np
import torch

from inferlab.errors import CheckpointError
from inferlab.quant.int4 import Int4Linear, pack_int4, unpack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [K, M] (0 .. 2^bits - 1) -> int32 [K * bits / 32, M], a little-endian bit stream along K."""
    k, m = codes.shape
    c = codes.to(torch.int64).cpu().numpy().astype(np.uint64)
    bitplanes = ((c[:, None, :] >> np.arange(bits, dtype=np.uint64)[None, :, None]) & 1).reshape(k * bits, m)
    words = (bitplanes.reshape(-1, 32, m) << np.arange(32, dtype=np.uint64)[None, :, None]).sum(1)
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


def unpack_bits(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of :func:`pack_bits`: int32 [W, M] -> codes [W * 32 / bits, M] (int64)."""
    w = words.cpu().numpy().view(np.uint32).astype(np.uint64)
    stream = ((w[:, None, :] >> np.arange(32, dtype=np.uint64)[None, :, None]) & 1).reshape(-1, bits, w.shape[1])
    return torch.from_numpy((stream << np.arange(bits, dtype=np.uint64)[None, :, None]).sum(1).astype(np.int64))


def _int4_parts(mod: Int4Linear):
    """Codes [out, in], zeros [out, ng], scales [out, ng], g_idx [in] in the original column order."""
    q = unpack_int4(mod.qweight).long()
    g = torch.arange(mod.in_features) // mod.group_size
    if mod.perm is not None:
        orig_q, g_idx = torch.empty_like(q), torch.empty_like(g)
        perm = mod.perm.long().cpu()
        orig_q[:, perm], g_idx[perm] = q, g
        q, g = orig_q, g_idx
    return q, mod.zeros.long(), mod.scales, g


def to_gptq(mod: Int4Linear, sym: bool) -> dict[str, torch.Tensor]:
    q, zeros, scales, g_idx = _int4_parts(mod)
    mask = 2 ** mod.bits - 1
    stored = (zeros - 1) & mask if sym else zeros  # v1 stores zero - 1
    return {"qweight": pack_bits(q.T, mod.bits), "qzeros": pack_bits(stored, mod.bits).T.contiguous(),
            "scales": scales.T.contiguous().half(), "g_idx": g_idx.to(torch.int32)}


def from_gptq(t: dict[str, torch.Tensor], bits: int, group_size: int, act_order: bool, v1: bool) -> dict:
    q = unpack_bits(t["qweight"], bits).T  # [out, in]
    out, cols = q.shape
    zeros = unpack_bits(t["qzeros"].T.contiguous(), bits)  # [out, ng]
    if v1:
        zeros = (zeros + 1) & (2 ** bits - 1)
    scales = t["scales"].T.contiguous()
    g_idx = t.get("g_idx")
    group_size = cols if group_size == -1 else group_size
    if g_idx is not None and not act_order:
        if not torch.equal(g_idx.long(), torch.arange(cols) // group_size):
            raise CheckpointError("g_idx is not in order but desc_act is false: the checkpoint's config "
                                  "disagrees with its weights")
    res = {"qweight": pack_int4(q), "scales": scales.half(), "zeros": zeros.to(torch.uint8)}
    if act_order:
        g_idx = g_idx.long() if g_idx is not None else torch.arange(cols) // group_size
        perm = torch.argsort(g_idx, stable=True)
        if not torch.equal(g_idx[perm], torch.arange(cols) // group_size):
            raise CheckpointError(f"act-order groups are not all of size {group_size}: cannot regroup them")
        res["qweight"], res["perm"] = pack_int4(q[:, perm]), perm.to(torch.int32)
    if "bias" in t:
        res["bias"] = t["bias"]
    return res


def _awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """[K, out] codes -> int32 [K, out / 8] in AWQ's interleaved nibble order."""
    c = codes.to(torch.int64).view(codes.shape[0], -1, 8)[..., list(AWQ_ORDER)]
    words = (c << (4 * torch.arange(8))).sum(-1)
    return torch.from_numpy(words.numpy().astype(np.uint32).view(np.int32))


def _awq_unpack(words: torch.Tensor) -> torch.Tensor:
    w = torch.from_numpy(words.numpy().view(np.uint32).astype(np.int64))
    nib = (w[..., None] >> (4 * torch.arange(8))) & 0xF  # nibble i holds column AWQ_ORDER[i]
    out = torch.empty_like(nib)
    out[..., list(AWQ_ORDER)] = nib
    return out.reshape(words.shape[0], -1)


def to_awq(mod: Int4Linear) -> dict[str, torch.Tensor]:
    q, zeros, scales, _ = _int4_parts(mod)
    return {"qweight": _awq_pack(q.T), "qzeros": _awq_pack(zeros.T), "scales": scales.T.contiguous().half()}


def from_awq(t: dict[str, torch.Tensor]) -> dict:
    res = {"qweight": pack_int4(_awq_unpack(t["qweight"]).T), "zeros": _awq_unpack(t["qzeros"]).T.to(torch.uint8),
           "scales": t["scales"].T.contiguous().half()}
    if "bias" in t:
        res["bias"] = t["bias"]
    return res
