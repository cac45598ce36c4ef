"""Generation with a contiguous KV cache: one prefill, then one decode step per token.

This is the simple reference path the lessons compare against; ``LLM`` and the CLI run on the
engine (``inferlab.engine``: paged KV cache, ragged batches, continuous batching), and the tests
check that it produces these tokens exactly.

    prefill:  the whole prompt in one forward pass (matrix-matrix: compute-bound); it fills the
              cache with every prompt token's K and V and yields the first new token.
    decode:   one token per forward pass (matrix-vector: every weight is read from memory to
              produce a single token, so it is memory-bound), attending to the cached K/V.

A batch of prompts of different lengths is left-padded to one length; the attention mask hides
the padding and each row's positions start at 0 at its first real token. Rows that finish keep
running until the whole batch is done: the waste continuous batching removes.
"""
from __future__ import annotations

import time
from typing import Iterator

import torch

from inferlab.attention import AttentionMetadata
from inferlab.cache import ContiguousKVCache
from inferlab.model.context import fit_max_tokens
from inferlab.sampling import SamplingParams, make_generator, sample
from inferlab.sequence import Sequence, SequenceStatus


def prefill(model, input_ids, positions, cache, key_mask=None) -> torch.Tensor:
    """Run the prompt [B, T] through the model, filling the cache; return last logits [B, V]."""
    meta = AttentionMetadata(positions=positions, kv_cache=cache, cache_start=0, key_mask=key_mask)
    return model(input_ids, meta, last_only=True)[:, -1]


def decode_one_token(model, tokens, positions, cache, cache_start, key_mask=None) -> torch.Tensor:
    """One new token per row: tokens [B] at cache slot ``cache_start``; return logits [B, V]."""
    meta = AttentionMetadata(positions=positions[:, None], kv_cache=cache, cache_start=cache_start,
                             key_mask=key_mask)
    return model(tokens[:, None], meta)[:, -1]


def _sync(device) -> None:
    """GPU kernels run asynchronously: wait for them before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _padded_batch(prompts: list[list[int]], total_len: int, device):
    """Left-pad prompts; return input_ids, positions and the key mask over all slots (None: no padding)."""
    b, p = len(prompts), max(len(x) for x in prompts)
    input_ids = torch.zeros(b, p, dtype=torch.long)
    key_mask = torch.ones(b, total_len, dtype=torch.bool)
    pads = []  # left padding per row
    for i, ids in enumerate(prompts):
        pad = p - len(ids)
        input_ids[i, pad:] = torch.tensor(ids)
        key_mask[i, :pad] = False
        pads.append(pad)
    pads_t = torch.tensor(pads)[:, None]
    positions = (torch.arange(p)[None] - pads_t).clamp(min=0)
    key_mask = key_mask.to(device) if any(pads) else None
    return input_ids.to(device), positions.to(device), key_mask


@torch.inference_mode()
def generate_stream(model, prompts: list[list[int]], params: list[SamplingParams],
                    eos_token_ids=(), tokenizer=None, stats: dict | None = None) -> Iterator[list[Sequence]]:
    """Generate for a batch; yield the sequences after every step (for streaming)."""
    device, cfg = model.device, model.config
    seqs = []
    for i, (ids, sp) in enumerate(zip(prompts, params)):
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        if sp.structured_outputs is not None:
            raise ValueError("structured_outputs needs the engine: use LLM(...).generate, not the contiguous reference path")
        fits = fit_max_tokens(sp.max_tokens, len(ids), cfg.max_position_embeddings,
                              context_name="model's context")  # stop at the context's end
        if sp.max_tokens != fits:
            sp = SamplingParams(**{**sp.__dict__, "max_tokens": fits})
        seqs.append(Sequence(i, list(ids), sp, status=SequenceStatus.RUNNING))
    max_new = max(s.params.max_tokens for s in seqs)
    p = max(len(x) for x in prompts)
    total = p + max_new
    cache = ContiguousKVCache.for_model(cfg, len(seqs), total, model.dtype, device)
    gens = [make_generator(s.params.seed, device) for s in seqs]
    sps = [s.params for s in seqs]
    input_ids, positions, key_mask = _padded_batch(prompts, total, device)

    t0 = time.perf_counter()
    logits = prefill(model, input_ids, positions, cache, key_mask)
    tokens = sample(logits, sps, gens)
    _sync(device)
    t1 = time.perf_counter()
    next_pos = positions[:, -1] + 1
    slot, steps = p, 0
    while True:
        for seq, tok in zip(seqs, tokens.tolist()):
            if not seq.is_finished:
                seq.append_token(tok, eos_token_ids, tokenizer)
        yield seqs
        if all(s.is_finished for s in seqs):
            break
        logits = decode_one_token(model, tokens, next_pos, cache, slot, key_mask)
        tokens = sample(logits, sps, gens)
        next_pos, slot, steps = next_pos + 1, slot + 1, steps + 1
    _sync(device)
    t2 = time.perf_counter()
    if stats is not None:
        prompt_tokens = sum(len(x) for x in prompts)
        stats.update(prefill_s=t1 - t0, decode_s=t2 - t1, prefill_tokens=prompt_tokens,
                     decode_steps=steps, batch_size=len(seqs),
                     prefill_tokens_per_s=prompt_tokens / max(t1 - t0, 1e-9),
                     decode_tokens_per_s=steps * len(seqs) / max(t2 - t1, 1e-9))


def generate(model, prompts, params, eos_token_ids=(), tokenizer=None, stats=None) -> list[Sequence]:
    """Like :func:`generate_stream`, returning the finished sequences."""
    seqs = None
    for seqs in generate_stream(model, prompts, params, eos_token_ids, tokenizer, stats):
        pass
    return seqs
