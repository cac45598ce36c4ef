"""Attention over a ragged batch and a paged KV cache (vLLM's metadata names).

A *ragged batch* runs the new tokens of B sequences in one forward without padding: their
token ids are flattened into one row of N tokens (the model sees batch 1 x N). Sequence i
contributes ``query_lens[i]`` new tokens, the *last* ``query_lens[i]`` of its
``context_lens[i]`` tokens (the rest are already in the cache). Prefill of a prompt, a chunk of
a long prompt and a decode step (one token) are all the same thing with different lengths.

    input_ids     [N]        the new tokens, sequence after sequence
    positions     [N]        each token's position in its own sequence (drives RoPE)
    slot_mapping  [N]        the cache slot each new token's K/V is written to
    block_tables  [B, max_blocks] and context_lens [B]: where to read each sequence's K/V

The runner orders the batch decodes first: the first ``num_decodes`` sequences have one query
each and take the grouped-matmul fast path together; the next ``num_multi_query`` have a few
queries each (up to ``MULTI_QUERY_MAX``: a speculative verify, k guesses behind the last token, or
a short chunk; with the torch backend on a CPU, prompts and chunks up to ``SHORT_PROMPT_MAX`` too)
and are computed together: on a CPU each query is one row of the C decode loop over the positions
it may see, elsewhere the queries are padded to the longest; the others (prompts, long chunks)
run one SDPA call each with the causal bottom-right mask of
:func:`attention_mask` (and Mistral's window).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from inferlab.attention import cpu_decode
from inferlab.attention.base import attention_mask

MULTI_QUERY_MAX = 17  # a verify of up to 16 guesses (inferlab.spec.config's cap) plus the last token
#: Where the torch backend runs on a CPU, a prompt or chunk of up to this many tokens joins the
#: multi-query sequences too: its rows then take the same C loop in a step of the C layers
#: (``inferlab.model.decode_layers``, up to as many rows) and in one of the modules, so a
#: sequence's bits do not depend on the step it shares. On this CPU smollm2 prefills 8 to 512
#: tokens this way in 0.6-0.9x (fp32: 0.8-0.96x) the time of the per-module path with SDPA.
SHORT_PROMPT_MAX = 512


@dataclasses.dataclass
class PagedAttentionMetadata:
    positions: torch.Tensor  # [1, N]
    kv_cache: object  # a PagedKVCache
    slot_mapping: torch.Tensor  # [N]
    block_tables: torch.Tensor  # [B, max_blocks] (padded with 0: masked by context_lens)
    context_lens: torch.Tensor  # [B]
    query_lens: list[int]  # host copies of the lengths, for the per-sequence loop
    context_lens_host: list[int]
    num_decodes: int = 0
    num_multi_query: int = 0  # the sequences after the decodes with 2..MULTI_QUERY_MAX queries
    masks_built: bool = False
    decode_slots: torch.Tensor | None = None  # [num_decodes, S] cache slot of every context token
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, S] additive bias (0 / -inf), or None
    prefill_masks: list = dataclasses.field(default_factory=list)  # one per long prefill/chunk
    multi_query: dict | None = None  # slots [M, S], rows [M, Qmax], keep [T], bias [M, 1, 1, Qmax, S]
    sliding_window: int | None = None  # the model's (Mistral), set by build_masks

    def build_masks(self, sliding_window: int | None = None) -> None:
        """What every layer shares, built once per forward (the model calls this).

        Decodes read S = their longest context: ``decode_slots`` [B, S] is the cache slot of each
        context token (through the block table), and a sequence with a shorter context (or a
        window that bites) gets an additive bias of -inf on the slots it must not see. A lone
        decode without a window needs none: the single-stream path stays lean.
        """
        if self.masks_built:
            return
        self.masks_built = True
        self.sliding_window = sliding_window
        d, device = self.num_decodes, self.context_lens.device
        if d:
            ctx_host = self.context_lens_host[:d]
            s = max(ctx_host)
            bs = self.kv_cache.block_size
            nb = -(-s // bs)
            offsets = torch.arange(bs, device=device)
            slots = self.block_tables[:d, :nb, None] * bs + offsets  # [B, nb, bs]
            self.decode_slots = slots.view(d, nb * bs)[:, :s].contiguous()
            window_bites = sliding_window is not None and s > sliding_window
            if window_bites or min(ctx_host) < s:
                pos = torch.arange(s, device=device)
                ctx = self.context_lens[:d, None]
                visible = pos[None] < ctx
                if window_bites:
                    visible &= pos[None] > ctx - 1 - sliding_window
                bias = torch.zeros(visible.shape, dtype=torch.float32, device=device)
                self.decode_mask = bias.masked_fill_(~visible, float("-inf"))[:, None, None, :]
        m = self.num_multi_query
        if m:
            self.multi_query = self._multi_query_layout(sliding_window)
        self.prefill_masks = [attention_mask(q, c - q, None, sliding_window, device)
                              for q, c in zip(self.query_lens[d + m:], self.context_lens_host[d + m:])]

    def _multi_query_layout(self, sliding_window: int | None) -> dict:
        """The M short multi-query sequences as one padded batch: each reads its S = longest
        context slots through its block table, its queries are gathered to [M, Qmax] (padding
        repeats its last query; ``keep`` lists the flat M x Qmax positions of the real ones, an
        index rather than a boolean mask, so a compiled step knows the output's size), and query i of a sequence of q queries over
        c tokens sits at position c - q + i: it sees the slots up to there (bottom-right causal)."""
        d, m, device = self.num_decodes, self.num_multi_query, self.context_lens.device
        q_lens, ctx = self.query_lens[d:d + m], self.context_lens_host[d:d + m]
        s, qmax, bs = max(ctx), max(q_lens), self.kv_cache.block_size
        nb = -(-s // bs)
        offsets = torch.arange(bs, device=device)
        slots = (self.block_tables[d:d + m, :nb, None] * bs + offsets).view(m, nb * bs)[:, :s].contiguous()
        starts, rows, keep, pos = 0, [], [], []
        for j, (q, c) in enumerate(zip(q_lens, ctx)):
            rows.append([starts + min(i, q - 1) for i in range(qmax)])
            keep += range(j * qmax, j * qmax + q)
            pos.append([c - q + min(i, q - 1) for i in range(qmax)])
            starts += q
        pos = torch.tensor(pos, device=device)[..., None]  # [M, Qmax, 1]
        key = torch.arange(s, device=device)
        visible = key <= pos
        if sliding_window is not None:
            visible &= key > pos - sliding_window
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=device).masked_fill_(~visible, float("-inf"))
        seq_of_row = [j for j, q in enumerate(q_lens) for _ in range(q)]  # for the C loop: one query per row,
        row_lens = [c - q + i + 1 for q, c in zip(q_lens, ctx) for i in range(q)]  # seeing its own prefix
        return {"slots": slots, "rows": torch.tensor(rows, device=device),
                "keep": torch.tensor(keep, device=device), "bias": bias[:, None, None],
                "row_slots": slots.index_select(0, torch.tensor(seq_of_row, device=device)).to(torch.int64),
                "row_lens": torch.tensor(row_lens, dtype=torch.int64, device=device)}


def paged_decode(q, k_slots, v_slots, decode_slots, bias=None) -> torch.Tensor:
    """One query per sequence, K/V read through the block tables.

    q [B, Hq, D]; k_slots/v_slots: one layer's cache seen as [num_blocks * block_size, Hkv, D];
    decode_slots [B, S]: the slot of each context token (``block_table[p // bs] * bs + p % bs``);
    bias [B, 1, 1, S] (0 or -inf) or None. Returns [B, Hq, D]. The query heads that share a K/V
    head are multiplied together (GQA), as in ``torch_sdpa.decode_attention``.
    """
    b, hq, d = q.shape
    hkv = k_slots.shape[1]
    flat = decode_slots.view(-1)  # index_select: about half the cost of advanced indexing on CPU
    k = k_slots.index_select(0, flat).view(b, -1, hkv, d).transpose(1, 2)  # [B, Hkv, S, D]
    v = v_slots.index_select(0, flat).view(b, -1, hkv, d).transpose(1, 2)
    scores = (q.view(b, hkv, hq // hkv, d) @ k.transpose(-1, -2)) * d**-0.5  # [B, Hkv, G, S]
    if bias is not None:
        scores += bias
    return (scores.softmax(-1) @ v).reshape(b, hq, d)


def paged_multi_query(q, k_slots, v_slots, layout: dict) -> torch.Tensor:
    """A few queries per sequence, every sequence at once: q [Hq, T, D], the T new tokens of the
    M sequences one after the other; ``layout`` from ``PagedAttentionMetadata``. Returns [Hq, T, D].
    The grouped matmuls of :func:`paged_decode` with the G query heads of a K/V head and the
    Qmax queries of a sequence on one axis (G x Qmax rows against one K/V head: a 4-D batched
    product, no broadcast over a fifth axis), and a causal bias."""
    hq, _, d = q.shape
    hkv = k_slots.shape[1]
    slots, rows, keep = layout["slots"], layout["rows"], layout["keep"]
    m, qmax = rows.shape
    g = hq // hkv
    bias = layout.get(("bias", hkv, g))
    if bias is None:  # [M * Hkv, G * Qmax, S]: built by the first layer, shared by the rest
        bias = layout["bias"].to(q.dtype).expand(m, hkv, g, qmax, -1).reshape(m * hkv, g * qmax, -1)
        layout[("bias", hkv, g)] = bias
    flat = slots.view(-1)
    k = k_slots.index_select(0, flat).view(m, -1, hkv, d).permute(0, 2, 3, 1)  # [M, Hkv, D, S]
    v = v_slots.index_select(0, flat).view(m, -1, hkv, d).transpose(1, 2)  # [M, Hkv, S, D]
    qg = (q * d**-0.5).index_select(1, rows.view(-1)).view(hkv, g, m, qmax, d)
    qg = qg.permute(2, 0, 1, 3, 4).reshape(m, hkv, g * qmax, d)  # [M, Hkv, G*Qmax, D]
    scores = torch.baddbmm(bias, qg.reshape(m * hkv, g * qmax, d), k.reshape(m * hkv, d, -1))
    out = torch.bmm(scores.softmax(-1), v.reshape(m * hkv, -1, d))  # [M*Hkv, G*Qmax, D]
    out = out.view(m, hkv, g, qmax, d).permute(1, 2, 0, 3, 4).reshape(hq, m * qmax, d)
    return out.index_select(1, keep)


def torch_decode(q, layer_idx: int, meta: PagedAttentionMetadata) -> torch.Tensor:
    """The decode step of the torch backend: q [B_decode, Hq, D] -> [B_decode, Hq, D].

    A kernel takes its place with the same signature, reading ``meta.kv_cache.k[layer_idx]``
    ([num_blocks, block_size, Hkv, D]), ``meta.block_tables[:B]`` and ``meta.context_lens[:B]``.
    """
    cache = meta.kv_cache
    k_slots, v_slots = cache.k_slots[layer_idx], cache.v_slots[layer_idx]
    out = cpu_decode.paged_decode(q, k_slots, v_slots, meta.decode_slots, meta.context_lens[:q.shape[0]],
                                  meta.sliding_window)  # one C loop where it runs
    return out if out is not None else paged_decode(q, k_slots, v_slots, meta.decode_slots, meta.decode_mask)


def torch_prefill(q, k, v, mask) -> torch.Tensor:
    """One prompt or prompt chunk: q [1, Hq, T, D] are the last T of k/v's S positions; ``mask``
    [1, 1, T, S] or None for plain causal (bottom-right, which SDPA's ``is_causal`` is when T == S)."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:  # a plain causal prompt (or a single query that sees everything)
        return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def torch_multi_query(q, layer_idx: int, meta: PagedAttentionMetadata) -> torch.Tensor:
    """The short multi-query sequences (speculative verifies) of the torch backend: q [Hq, T, D].
    On a CPU each row is one query of the C decode loop, over the positions it may see (as
    ``inferlab.model.decode_layers`` computes it, so both give the same bits)."""
    cache = meta.kv_cache
    k_slots, v_slots, layout = cache.k_slots[layer_idx], cache.v_slots[layer_idx], meta.multi_query
    out = cpu_decode.paged_decode(q.transpose(0, 1), k_slots, v_slots, layout["row_slots"], layout["row_lens"],
                                  meta.sliding_window)
    return out.transpose(0, 1) if out is not None else paged_multi_query(q, k_slots, v_slots, layout)


def paged_attention_forward(layer_idx: int, q, k, v, meta: PagedAttentionMetadata,
                            decode_fn=torch_decode, prefill_fn=torch_prefill,
                            multi_query_fn=torch_multi_query) -> torch.Tensor:
    """Write this call's K/V through ``slot_mapping``, then attend. q [1, Hq, N, D], k/v [1, Hkv, N, D].
    ``decode_fn(q, layer_idx, meta)`` computes the single-query sequences (see :func:`torch_decode`),
    ``multi_query_fn(q, layer_idx, meta)`` the short multi-query ones together (see
    :func:`torch_multi_query`), ``prefill_fn(q, k, v, mask)`` each prompt or chunk against its
    cached and new K/V (see :func:`torch_prefill`): the places an attention kernel plugs in."""
    cache = meta.kv_cache
    cache.write(layer_idx, k[0].transpose(0, 1), v[0].transpose(0, 1), meta.slot_mapping)
    d = meta.num_decodes
    parts = []
    if d:
        out = decode_fn(q[0, :, :d].transpose(0, 1), layer_idx, meta)
        parts.append(out.transpose(0, 1)[None])
    start, m = d, meta.num_multi_query
    if m:
        t = sum(meta.query_lens[d:d + m])
        out = multi_query_fn(q[0, :, d:d + t], layer_idx, meta)
        parts.append(out[None])
        start += t
    for i, (q_len, ctx) in enumerate(zip(meta.query_lens[d + m:], meta.context_lens_host[d + m:])):
        qi = q[:, :, start:start + q_len]
        if ctx == q_len:  # nothing cached before: use this call's K/V directly
            ki, vi = k[:, :, start:start + q_len], v[:, :, start:start + q_len]
        else:
            nb = -(-ctx // cache.block_size)
            ki, vi = cache.gather(layer_idx, meta.block_tables[d + m + i, :nb], ctx)
            ki, vi = ki.transpose(0, 1)[None], vi.transpose(0, 1)[None]
        parts.append(prefill_fn(qi, ki, vi, meta.prefill_masks[i]))
        start += q_len
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
