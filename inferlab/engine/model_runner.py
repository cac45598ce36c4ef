"""The model runner: one forward pass over a ragged batch (nano-vllm's ModelRunner).

The scheduler says, for each sequence, how many of its tokens to compute now. The runner turns
that into the flat layout of ``inferlab.attention.paged`` (input_ids, positions, slot_mapping,
block_tables, context lengths), runs the model once over every sequence's new tokens, and returns
the logits of each sequence's last new token, or of its last 1 + k new tokens when k of them are
speculative guesses to verify (vLLM's ``SpecDecodeMetadata``: one flat tensor, sequence after
sequence, in the caller's order). Decodes (one new token) go first so attention can batch them.

With ``compile_decode`` a step in which every sequence decodes one token runs a ``torch.compile``d
forward: inductor fuses each layer's norms, RoPE, residual adds and attention glue into a few
loops, so a small model stops paying ~10 us of dispatch per op (the CPU counterpart of the CUDA
graphs vLLM captures per batch size). Shapes are dynamic in the context length; each batch size
compiles once. Prefills, chunks and verifies stay eager: they are few and their shapes vary.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch

from inferlab.model import packing
from inferlab.attention.paged import MULTI_QUERY_MAX, SHORT_PROMPT_MAX, PagedAttentionMetadata
from inferlab.attention.torch_sdpa import TorchSDPABackend
from inferlab.cache.paged import PagedKVCache
from inferlab.device import compile_errors

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SeqInput:
    """One sequence's share of a step: its new tokens, how many tokens precede them in the cache,
    and its block table (covering at least num_computed + len(token_ids) slots)."""

    token_ids: list[int]
    num_computed: int
    block_table: list[int]


#: Inductor's generated CPU code for the decode step at 256-bit vectors. With its AVX-512 code
#: (torch 2.13's default where the CPU has AVX-512), the compiled step corrupted the heap on an
#: Intel Xeon with AVX-512 FP16 and AMX ("malloc(): unaligned tcache chunk detected", an abort at a
#: later allocation), and ran cleanly at 256 bits; the products are the project's own loops either
#: way, so only the norms, RoPE and attention glue run on narrower vectors.
CPU_COMPILE_OPTIONS = {"cpp.simdlen": 256}


class ModelRunner:
    def __init__(self, model, kv_cache: PagedKVCache, compile_decode: bool = False):
        self.model, self.kv_cache = model, kv_cache
        self.block_size = kv_cache.block_size
        self.device = model.device
        self.compiled = torch.compile(model.forward, dynamic=True, options=CPU_COMPILE_OPTIONS
                                      if model.device.type == "cpu" else None) if compile_decode else None
        self.compiled_batch_sizes: set[int] = set()  # the decode batch sizes run compiled so far

    def prepare(self, seqs: list[SeqInput]):
        """Metadata for ``seqs`` in decode-first order; returns (input_ids, metadata, last_rows, order).

        All the int vectors travel to the device as one tensor (one copy, then views): on a
        small model a step is short enough for eight separate host-to-device tensors to show.
        """
        rows = short_prompt_rows(self.model)
        ranks = [_rank(len(s.token_ids), s.num_computed, rows) for s in seqs]
        order = _order_of(ranks)
        bs = self.block_size
        ids, positions, slots, tables, q_lens, ctx_lens = [], [], [], [], [], []
        for i in order:
            s = seqs[i]
            start, q = s.num_computed, len(s.token_ids)
            end = start + q
            if q < 1:
                raise ValueError("every scheduled sequence needs at least one new token")
            if end > len(s.block_table) * bs:
                raise ValueError(f"block table of {len(s.block_table)} blocks cannot hold {end} tokens")
            ids += s.token_ids
            positions += range(start, end)
            table = s.block_table
            p = start
            while p < end:  # one run of consecutive slots per block, not one Python step per token
                block, offset = divmod(p, bs)
                take = min(bs - offset, end - p)
                first = table[block] * bs + offset
                slots += range(first, first + take)
                p += take
            tables.append(table)
            q_lens.append(q)
            ctx_lens.append(end)
        width = max(len(t) for t in tables)
        padded = []
        for t in tables:
            padded += t
            padded += [0] * (width - len(t))  # padding: masked by context_lens
        last = [e - 1 for e in query_start_loc(q_lens)[1:]]  # each sequence's last new token, in batch order
        inverse = [0] * len(seqs)
        for j, i in enumerate(order):
            inverse[i] = j
        last = [last[inverse[i]] for i in range(len(seqs))]  # back in the caller's order
        n, b = len(ids), len(seqs)
        flat = torch.tensor(ids + positions + slots + ctx_lens + last + padded, device=self.device)
        parts = flat.split([n, n, n, b, b, b * width])
        meta = PagedAttentionMetadata(
            positions=parts[1][None], kv_cache=self.kv_cache, slot_mapping=parts[2],
            block_tables=parts[5].view(b, width), context_lens=parts[3], query_lens=q_lens,
            context_lens_host=ctx_lens, num_decodes=sum(1 for q in q_lens if q == 1),
            num_multi_query=ranks.count(1))
        return parts[0][None], meta, parts[4], order

    @torch.inference_mode()
    def execute(self, seqs: list[SeqInput], copies: list[tuple[int, int]] = (),
                all_logits: bool = False, num_logits: list[int] | None = None,
                extra_rows: list[tuple[int, int] | None] | None = None):
        """Run one forward. Returns logits [B, V] of each sequence's last new token, in the order
        of ``seqs``; with ``num_logits``, [sum(num_logits), V]: the last ``num_logits[i]`` rows of
        sequence i, sequence after sequence (speculative verification: 1 + k rows each); with
        ``all_logits``, a list of [q_len_i, V] tensors (every new token).

        ``extra_rows[i] = (lo, hi)``: also new tokens lo..hi-1 of sequence i (prompt log-probs),
        appended after all the rows above, sequence after sequence. The lm_head runs on those
        rows only: a step where no sequence asks computes exactly what it did without them."""
        self.kv_cache.copy_blocks(list(copies))  # copy-on-write before anyone writes
        input_ids, meta, last, order = self.prepare(seqs)
        if all_logits:
            logits = self.model(input_ids, meta)[0]
            cu = query_start_loc(meta.query_lens)
            rows = [None] * len(seqs)
            for j, i in enumerate(order):
                rows[i] = logits[cu[j]:cu[j + 1]]
            return rows
        if extra_rows is not None and any(extra_rows):
            last = logits_indices(meta.query_lens, order, num_logits or [1] * len(seqs), self.device, extra_rows)
        elif num_logits is not None and any(n != 1 for n in num_logits):
            last = logits_indices(meta.query_lens, order, num_logits, self.device)
        if self.compiled is not None and meta.num_decodes == len(seqs) and packing.ready_to_compile(self.model):
            meta.build_masks(self.model.config.sliding_window)  # plain data for the graph's guards
            try:
                with _no_duck_shapes():  # a context length equal to a pool size must not join them
                    logits = self.compiled(input_ids, meta, logits_indices=last)[0]
                self.compiled_batch_sizes.add(len(seqs))
                return logits
            except compile_errors() as exc:  # no C++ compiler, an unsupported op: decode eagerly from now on
                log.warning("inferlab: the decode step runs eagerly, torch.compile failed: %s",
                            str(exc).splitlines()[0][:200])
                self.compiled = None
        return self.model(input_ids, meta, logits_indices=last)[0]


def _no_duck_shapes():
    """Without this, torch.compile assumes two sizes equal at the first call stay equal (a context
    of 16 tokens and a block of 16 slots) and compiles again when they part."""
    try:
        from torch.fx.experimental import _config
        return _config.patch(use_duck_shape=False)
    except (ImportError, AttributeError):
        return contextlib.nullcontext()


def query_start_loc(lens: list[int]) -> list[int]:
    """Running totals [0, l0, l0 + l1, ...]: where each sequence's rows start in a flat batch, and
    where the last one ends (vLLM's ``query_start_loc``). The one place these totals are taken."""
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    return starts


def batch_order(query_lens: list[int], num_computed: list[int], model) -> list[int]:
    """The caller's index of each batch position in ``model``'s forward: decodes first, then the
    short multi-query ones (speculative verifies, short prompts), then the rest, stable
    (``prepare`` lays a forward out this way; a hook reading every row of it, like EAGLE's, maps
    rows back with it)."""
    rows = short_prompt_rows(model)
    return _order_of([_rank(q, c, rows) for q, c in zip(query_lens, num_computed)])


def short_prompt_rows(model) -> int:
    """How long a prompt or chunk may be and still join the multi-query sequences of ``model``'s
    forward: ``SHORT_PROMPT_MAX`` where its attention is the torch backend on a CPU (the prompt's
    rows then take the C loop the C layers take, ``inferlab.attention.paged``), else 0 (a prompt
    runs one SDPA or FlashAttention call)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or [getattr(model, "layer", None)]  # EAGLE: one
    backend = getattr(getattr(layers[0], "self_attn", None), "backend", None)
    return SHORT_PROMPT_MAX if type(backend) is TorchSDPABackend and model.device.type == "cpu" else 0


def _order_of(ranks: list[int]) -> list[int]:
    return sorted(range(len(ranks)), key=lambda i: ranks[i])


def _rank(q_len: int, num_computed: int, prompt_rows: int) -> int:
    """Where a sequence goes in the batch: 0 a decode (one query: a 1-token prompt too), 1 a few
    queries (a speculative verify or a short chunk over a cached context; a prompt or chunk of up
    to ``prompt_rows``, :func:`short_prompt_rows`), 2 a prompt or a long chunk (one SDPA call each)."""
    if q_len == 1:
        return 0
    return 1 if q_len <= prompt_rows or (q_len <= MULTI_QUERY_MAX and num_computed > 0) else 2


def logits_indices(query_lens: list[int], order: list[int], num_logits: list[int], device,
                   extra_rows: list[tuple[int, int] | None] | None = None) -> torch.Tensor:
    """Rows of the flat forward holding the last ``num_logits[i]`` new tokens of each sequence i
    (``query_lens`` in batch order, ``order[j]`` = the caller's index of batch position j), then
    for each sequence i with ``extra_rows[i] = (lo, hi)`` the rows of its new tokens lo..hi-1
    (``ModelRunner.execute``)."""
    cu, ends, starts = query_start_loc(query_lens), [0] * len(order), [0] * len(order)
    for j, i in enumerate(order):
        starts[i], ends[i] = cu[j], cu[j + 1]
    rows = []
    for i, n in enumerate(num_logits):
        if not 1 <= n:
            raise ValueError(f"sequence {i}: num_logits must be >= 1, got {n}")
        rows += range(ends[i] - n, ends[i])
    for i, span in enumerate(extra_rows or ()):
        if span:
            if not 0 <= span[0] < span[1] <= ends[i] - starts[i]:
                raise ValueError(f"sequence {i}: extra rows {span} lie outside its {ends[i] - starts[i]} new tokens")
            rows += range(starts[i] + span[0], starts[i] + span[1])
    return torch.tensor(rows, device=device)
