"""Paged decode attention as one C loop on the CPU (``cpu_decode.c``, beside this file: why).

:func:`paged_decode` computes what ``paged.paged_decode`` computes, reading each K/V row in
place through the slots instead of gathering the context first; it returns None where the loop
does not run (see ``inferlab.native.runs``), and the torch path takes the call.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from inferlab.native import library, runs

SOURCE = Path(__file__).with_name("cpu_decode.c")
DEPENDS = (Path(__file__).parent.parent / "clones.h", Path(__file__).parent.parent / "exp_poly.h")  # what cpu_decode.c includes
_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = (("inferlab_paged_decode", (_p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _i, _f, _p, _i)),)


def paged_decode(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, slots: torch.Tensor,
                 context_lens: torch.Tensor, window: int | None = None) -> torch.Tensor | None:
    """q [B, Hq, D]; k_slots/v_slots [num_slots, Hkv, D]; slots [B, S] the cache slot of each
    context position; context_lens [B]: sequence b sees its first context_lens[b] positions (the
    last ``window`` of them under a sliding window). Returns [B, Hq, D], or None."""
    b, hq, d = q.shape
    hkv = k_slots.shape[1]
    if not (runs(q, k_slots, v_slots) and k_slots.is_contiguous() and v_slots.is_contiguous()
            and hq % hkv == 0 and d % 16 == 0 and d <= 256) or (lib := library(SOURCE, _SIGNATURES, DEPENDS)) is None:
        return None
    q = q.contiguous()
    slots = slots.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    if lib.inferlab_paged_decode(q.data_ptr(), k_slots.data_ptr(), v_slots.data_ptr(), slots.data_ptr(),
                                 lens.data_ptr(), b, hq, hkv, d, slots.shape[1], window or 0, d ** -0.5,
                                 out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("inferlab: paged decode attention could not allocate its buffer")
    return out
