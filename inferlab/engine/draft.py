"""The draft-model proposer inside the engine (Leviathan et al. 2023; vLLM's ``draft_model``).

A smaller model with the target's vocabulary guesses k tokens one at a time. It keeps its own
paged KV cache laid out on the *target's* block tables (same block size, same block ids): the
scheduler reserves the guesses' slots once, for both models, and the prefix cache, copy-on-write,
preemption and rollback of the target's tables hold for the draft's K/V too.

Each step, after the scheduler reserved k lookahead slots per decoding sequence:

1. one draft forward over every scheduled sequence's own new tokens (a prompt chunk, the token
   sampled last, and the last guess kept by the previous step if the draft never saw it): the
   draft's K/V follows the target's, and each decoding sequence's last row gives q_1 and guess 1;
2. k - 1 single-token forwards (all decoding sequences together) give guesses 2..k and their q.

Rollback costs nothing: the draft's K/V past the kept tokens is overwritten when the sequence
grows again (the proposer's count of what the draft has seen, ``num_computed[seq_id]``, never
runs ahead of the target's ``num_computed_tokens``).
"""
from __future__ import annotations

import torch

from inferlab.cache.paged import PagedKVCache
from inferlab.engine.model_runner import ModelRunner, SeqInput
from inferlab.engine.proposer import Proposer, draw_guess


class DraftProposer(Proposer):
    def __init__(self, draft, target, num_blocks: int, block_size: int, confidence_threshold: float = 0.0):
        """``draft`` as ``spec_decode.draft_model`` returns it: the target's vocabulary, checked there."""
        self.model = draft
        self.confidence_threshold = confidence_threshold
        self.kv_cache = PagedKVCache.for_model(draft.config, num_blocks, block_size, target.dtype, target.device)
        self.runner = ModelRunner(draft, self.kv_cache)
        # seq_id -> tokens whose draft K/V is written (absent: as many as the target's, e.g. a fork)
        self.num_computed: dict[int, int] = {}

    def guess(self, seq, room: int) -> list[int]:
        """Placeholders: the draft writes K/V into the guesses' slots, so it guesses in ``fill``,
        once the scheduler has reserved them."""
        return [0] * room

    def fill(self, out, block_manager) -> dict[int, torch.Tensor]:
        """Fill each scheduled decode's reserved guesses (``spec_token_ids``) with the draft's;
        returns {scheduled index: q rows [k_i, V]} for the verifier."""
        inputs, need = [], []
        for j, s in enumerate(out.scheduled):
            seq = s.seq
            end = seq.num_computed_tokens + s.num_committed
            seen = min(self.num_computed.get(seq.seq_id, seq.num_computed_tokens), seq.num_computed_tokens)
            inputs.append(SeqInput(seq.token_ids(seen, end), seen, block_manager.block_table(seq.seq_id)))
            self.num_computed[seq.seq_id] = end
            if s.spec_token_ids:
                need.append(j)
        self.kv_cache.copy_blocks(list(out.copies))  # the target's copy-on-write pairs apply here too
        logits = self.runner.execute(inputs)  # [B, V]: each sequence's last row
        qs: dict[int, list[torch.Tensor]] = {j: [] for j in need}
        rows = {j: logits[j] for j in need}
        sure = dict.fromkeys(need, 1.0)
        for step in range(max((len(out.scheduled[j].spec_token_ids) for j in need), default=0)):
            live = [j for j in need if step < len(out.scheduled[j].spec_token_ids)]
            for j in live:
                s = out.scheduled[j]
                guess = draw_guess(rows[j], s.seq, sure[j], self.confidence_threshold)
                if guess is None:  # not worth its row: the chain stops here
                    s.keep_guesses(step)
                    continue
                tok, q, sure[j] = guess
                s.spec_token_ids[step] = tok  # the sequence's own list: guesses live there
                qs[j].append(q)
            feed = [j for j in live if step + 1 < len(out.scheduled[j].spec_token_ids)]
            if not feed:
                continue
            pos = {j: out.scheduled[j].seq.num_computed_tokens + out.scheduled[j].num_committed + step for j in feed}
            batch = [SeqInput([out.scheduled[j].spec_token_ids[step]], pos[j],
                              block_manager.block_table(out.scheduled[j].seq.seq_id)) for j in feed]
            for j, row in zip(feed, self.runner.execute(batch)):
                rows[j] = row
                self.num_computed[out.scheduled[j].seq.seq_id] = pos[j] + 1
        return {j: torch.stack(q) for j, q in qs.items() if q}

    def observe(self, out, ready, emitted, hidden, starts, running) -> None:
        """Forget the sequences that left (finished, aborted or preempted: a preempted one is
        recomputed from 0, and its draft K/V with it)."""
        live = {seq.seq_id for seq in running}
        self.num_computed = {sid: n for sid, n in self.num_computed.items() if sid in live}


def check_same_tokenizer(draft_tokenizer, target_tokenizer) -> None:
    """Guesses are token ids: they mean the same text only if both tokenizers map every token to
    the same id. Equal vocabulary sizes are not enough (two BPEs trained on different text have
    the same size and different tokens), so compare the token -> id tables themselves."""
    d = draft_tokenizer.hf.get_vocab(with_added_tokens=True)
    t = target_tokenizer.hf.get_vocab(with_added_tokens=True)
    if d != t:
        diff = sorted((tok for tok in d.keys() | t.keys() if d.get(tok) != t.get(tok)), key=lambda x: (len(x), x))
        e = diff[0]
        raise ValueError(f"the draft's tokenizer differs from the target's ({len(diff)} tokens differ, e.g. {e!r}: "
                         f"id {d.get(e)} in the draft, {t.get(e)} in the target): give a draft trained with "
                         "the target's tokenizer")
