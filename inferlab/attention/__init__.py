"""The attention seam: the model computes q, k, v and hands them to a backend.

A backend owns *where K and V live* (no cache, a contiguous cache, a paged cache) and *how
attention is computed* (torch SDPA, a Triton kernel). The model only calls
``backend.forward(layer_idx, q, k, v, metadata)``; swapping the backend switches the technique.
"""
from inferlab.attention.base import AttentionBackend, AttentionMetadata, attention_mask
from inferlab.attention.paged import PagedAttentionMetadata
from inferlab.attention.torch_sdpa import TorchSDPABackend
from inferlab.attention.triton import TritonBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "PagedAttentionMetadata", "attention_mask", "TorchSDPABackend", "get_backend"]

_BACKENDS = {"torch": TorchSDPABackend, "triton": TritonBackend}


def register_backend(name: str, cls: type[AttentionBackend]) -> None:
    _BACKENDS[name] = cls


def get_backend(name: str) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention_backend {name!r}: choose one of {sorted(_BACKENDS)}")
    return _BACKENDS[name]()
