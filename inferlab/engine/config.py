"""The engine's knobs (vLLM's names), checked once with a one-line error each, and their defaults.

    block_size              tokens per KV block (a power of two; 16 as in vLLM)
    num_kv_blocks           size of the KV pool. Default: enough blocks for ``max_num_seqs``
                            sequences of ``max_model_len`` tokens, capped by memory: on CUDA by
                            ``gpu_memory_utilization`` of the device's memory (minus what is
                            already allocated), on CPU by CPU_KV_CACHE_BYTES (1 GiB)
    max_num_seqs            sequences in one step (64)
    max_num_batched_tokens  token budget of one step. Default: max(max_model_len, 2048) without
                            chunked prefill (a whole prompt must fit); 512 with it
    max_model_len           longest sequence (prompt + output); default: the model's context
    enable_prefix_caching   reuse the KV blocks of a prompt prefix seen before
    enable_chunked_prefill  split long prompts into chunks that share steps with decodes
    batching_policy         "continuous" (iteration-level) or "static"
    scheduling_policy       vLLM's queue order: "fcfs" (arrival) or "priority" (each request's
                            ``priority``, lower first, ties by arrival; lowest preempted first)
    speculative_config      None, or vLLM's dict: {"method": "ngram", "num_speculative_tokens": 3,
                            "prompt_lookup_max": 4} (``inferlab.spec.config``)
    enforce_eager           True (the default here): every step runs op by op. False: steps that
                            only decode run a ``torch.compile``d forward, one graph per batch size
                            (the CPU counterpart of vLLM's CUDA graphs, which vLLM captures unless
                            enforce_eager); the first step of each size pays the compile
    max_logprobs            most top tokens a request's logprobs / prompt_logprobs may ask for (20, vLLM's)
    logprobs_mode           vLLM's: "raw_logprobs" (default: log_softmax of the model's logits) or
                            "processed_logprobs" (after temperature, top-k, top-p); inferlab.logprobs
"""
from __future__ import annotations

import dataclasses

import torch

from inferlab.cache.paged import PagedKVCache
from inferlab.engine.policy import check_name as check_batching_policy
from inferlab.logprobs import LOGPROBS_MODES, MAX_LOGPROBS
from inferlab.spec.config import SpeculativeConfig

CPU_KV_CACHE_BYTES = 1 << 30
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclasses.dataclass
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    batching_policy: str = "continuous"
    gpu_memory_utilization: float = 0.9
    speculative_config: dict | SpeculativeConfig | None = None
    scheduling_policy: str = "fcfs"
    enforce_eager: bool = True
    max_logprobs: int = MAX_LOGPROBS
    logprobs_mode: str = "raw_logprobs"

    def resolve(self, model_config, dtype, device) -> "EngineConfig":
        """Check every knob and fill in the defaults for this model; returns a new config."""
        c = dataclasses.replace(self)
        bs = c.block_size
        if not isinstance(bs, int) or bs < 1 or bs & (bs - 1):
            raise ValueError(f"block_size must be a power of two >= 1 (e.g. 16), got {bs!r}")
        if c.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {c.max_num_seqs}")
        check_batching_policy(c.batching_policy)
        if c.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown scheduling_policy {c.scheduling_policy!r}: choose 'fcfs' (arrival order) "
                             f"or 'priority' (each request's priority, lower first)")
        if not 0 < c.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {c.gpu_memory_utilization}")
        if c.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"unknown logprobs_mode {c.logprobs_mode!r}: choose one of {', '.join(LOGPROBS_MODES)}")
        if not isinstance(c.max_logprobs, int) or c.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be an integer >= 0, got {c.max_logprobs!r}")
        c.speculative_config = SpeculativeConfig.from_dict(c.speculative_config)
        context = model_config.max_position_embeddings
        c.max_model_len = c.max_model_len or context
        if not 1 < c.max_model_len <= context:
            raise ValueError(f"max_model_len must be in 2..{context} (the model's context), got {c.max_model_len}")
        if c.max_num_batched_tokens is None:
            c.max_num_batched_tokens = 512 if c.enable_chunked_prefill else max(c.max_model_len, 2048)
        if c.max_num_batched_tokens < c.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({c.max_num_seqs}): every running sequence needs a token per step")
        if not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({c.max_num_batched_tokens}) is smaller than max_model_len "
                             f"({c.max_model_len}): raise it or set enable_chunked_prefill=True")
        per_block = PagedKVCache.bytes_per_block(model_config, bs, dtype)
        if c.num_kv_blocks is None:
            want = -(-c.max_model_len // bs) * c.max_num_seqs
            c.num_kv_blocks = max(1, min(want, _kv_memory_budget(device, c.gpu_memory_utilization) // per_block))
        elif not isinstance(c.num_kv_blocks, int) or c.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be an integer >= 1, got {c.num_kv_blocks!r}")
        return c


def _kv_memory_budget(device, utilization: float) -> int:
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_KV_CACHE_BYTES
    total = torch.cuda.get_device_properties(device).total_memory
    return max(0, int(total * utilization) - torch.cuda.memory_allocated(device))
