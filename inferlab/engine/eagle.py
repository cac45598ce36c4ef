"""The EAGLE proposer inside the engine (Li et al. 2024; vLLM's and SGLang's ``eagle`` method).

EAGLE's draft (``inferlab.spec.eagle``) is one decoder layer whose input at position t is the token
x_t and the target's feature f_{t-1} (the last decoder layer's output there). Like the draft model
(``inferlab.engine.draft``) it keeps a paged KV cache on the *target's* block tables, so the slots
the scheduler reserves for guesses, prefix sharing, copy-on-write and preemption hold for it too.

Each step:

1. ``fill``: one draft pass over every scheduled sequence's tokens whose previous feature the
   target has computed (after a prefill, the whole prompt at once; in decoding, the last sampled
   token and the guesses the previous step kept). Each decoding sequence's last row gives f^ and,
   through the draft's head, guess 1 (and its q, for sampled requests);
2. k - 1 single-row passes (all decoding sequences together) take the guessed token and the
   guessed feature f^ as the next input: drafting in feature space.
3. ``observe``: the target's verify forward computed the true features of every row it ran
   (captured from its last layer, ``needs_hidden``); the proposer keeps those of the kept rows.

The draft's K/V of a guess was made from a guessed feature, so the proposer's count of positions
drafted from true features (``num_computed[seq_id]``) never counts guesses: the next step
recomputes the kept ones from the target's features, as EAGLE does. A position whose feature the
target never computed for this sequence (a prefix-cache hit) gets a zero feature: that costs
acceptance, never correctness, since the target verifies every guess.
"""
from __future__ import annotations

import torch

from inferlab.cache.paged import PagedKVCache
from inferlab.engine.model_runner import ModelRunner, SeqInput, batch_order, query_start_loc
from inferlab.engine.proposer import Proposer, draw_guess
from inferlab.quant.quantize import quantize_like_target
from inferlab.spec.eagle import last_layer_features, load_eagle


class EagleProposer(Proposer):
    needs_hidden = True  # the target's last-layer features of every row

    def __init__(self, target, folder, num_blocks: int, block_size: int, confidence_threshold: float = 0.0):
        self.target = target
        self.confidence_threshold = confidence_threshold
        # linears in Q8_0 when the target's are quantized: the draft's bytes set c
        self.draft = quantize_like_target(load_eagle(folder, target.config, target.device, target.dtype), target)
        self.kv_cache = PagedKVCache.for_model(self.draft.config, num_blocks, block_size, target.dtype, target.device)
        self.runner = ModelRunner(self.draft, self.kv_cache)  # its ragged layout (prepare) only
        self.num_computed: dict[int, int] = {}  # seq_id -> positions drafted from true features
        self.features: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (first position, [n, H])
        self.layout: list[tuple[int, int, int]] = []  # this step's (seq_id, num_computed, num_new_tokens)

    def capture(self, model):
        return last_layer_features(model)

    def guess(self, seq, room: int) -> list[int]:
        """Placeholders: the draft writes K/V into the guesses' slots, so it guesses in ``fill``."""
        return [0] * room

    def _known_end(self, sid: int, default: int) -> int:
        first, f = self.features.get(sid, (default, None))
        return first + (0 if f is None else len(f))

    def _feature_rows(self, sid: int, lo: int, hi: int) -> torch.Tensor:
        """The target's features at positions lo..hi-1 [hi - lo, H]; zeros where it has none."""
        out = torch.zeros(hi - lo, self.draft.config.hidden_size, dtype=self.target.dtype, device=self.target.device)
        if sid in self.features:
            first, f = self.features[sid]
            a, b = max(lo, first), min(hi, first + len(f))
            if b > a:
                out[a - lo:b - lo] = f[a - first:b - first]
        return out

    def _run(self, inputs: list[SeqInput], features: list[torch.Tensor]) -> torch.Tensor:
        """One draft pass over a ragged batch; returns each input's last row of f^ [len(inputs), H]."""
        input_ids, meta, last, order = self.runner.prepare(inputs)
        feats = torch.cat([features[i] for i in order])[None]
        embeds = self.target.model.embed_tokens(input_ids)
        return self.draft(embeds, feats, meta)[0, last]

    @torch.inference_mode()
    def fill(self, out, block_manager) -> dict[int, torch.Tensor]:
        """Fill each scheduled decode's reserved guesses; returns {scheduled index: q [k_i, V]}."""
        self.layout = [(s.seq.seq_id, s.seq.num_computed_tokens, s.num_new_tokens) for s in out.scheduled]
        self.kv_cache.copy_blocks(list(out.copies))  # the target's copy-on-write pairs apply here too
        inputs, feats, row_of = [], [], {}
        for j, s in enumerate(out.scheduled):
            seq, sid = s.seq, s.seq.seq_id
            c = seq.num_computed_tokens
            seen = min(self.num_computed.get(sid, c), c)
            stop = min(c + s.num_committed, self._known_end(sid, c) + 1)  # x_t needs f_{t-1}
            if stop > seen:
                row_of[j] = len(inputs)
                inputs.append(SeqInput(seq.token_ids(seen, stop), seen, block_manager.block_table(sid)))
                feats.append(self._feature_rows(sid, seen - 1, stop - 1))
                self.num_computed[sid] = stop
        need = [j for j, s in enumerate(out.scheduled) if s.spec_token_ids and j in row_of]
        if not inputs:
            return {}
        last = self._run(inputs, feats)
        rows = {j: last[row_of[j]] for j in need}
        qs: dict[int, list[torch.Tensor]] = {j: [] for j in need}
        sure = dict.fromkeys(need, 1.0)
        vocab, d2t = self.target.config.vocab_size, self.draft.d2t
        for step in range(max((len(out.scheduled[j].spec_token_ids) for j in need), default=0)):
            live = [j for j in need if step < len(out.scheduled[j].spec_token_ids)]
            if not live:
                break
            logits = self.draft.logits(torch.stack([rows[j] for j in live]))  # [live, draft vocab]
            for j, row in zip(live, logits):
                s = out.scheduled[j]
                guess = draw_guess(row, s.seq, sure[j], self.confidence_threshold)
                if guess is None:  # not worth its row: the chain stops here
                    s.keep_guesses(step)
                    continue
                pick, q_small, sure[j] = guess
                s.spec_token_ids[step] = int(d2t[pick])  # the sequence's own list: guesses live there
                qs[j].append(torch.zeros(vocab, dtype=q_small.dtype, device=q_small.device).index_copy_(0, d2t, q_small))
            feed = [j for j in live if step + 1 < len(out.scheduled[j].spec_token_ids)]
            if feed:  # the guessed token and the guessed feature make the next input
                batch = [SeqInput([out.scheduled[j].spec_token_ids[step]],
                                  out.scheduled[j].seq.num_computed_tokens + out.scheduled[j].num_committed + step,
                                  block_manager.block_table(out.scheduled[j].seq.seq_id)) for j in feed]
                for j, row in zip(feed, self._run(batch, [rows[j][None] for j in feed])):
                    rows[j] = row
        # the forward's layout, as observe reads it: the chains that stopped early have fewer rows
        self.layout = [(s.seq.seq_id, s.seq.num_computed_tokens, s.num_new_tokens) for s in out.scheduled]
        return {j: torch.stack(q) for j, q in qs.items() if q}

    def observe(self, out, ready, emitted, hidden, starts, running) -> None:
        """Keep the target's features of the rows this step kept (``hidden`` [N, H]: every row of
        the forward, in the runner's batch order); forget the sequences that left."""
        order = batch_order([q for _, _, q in self.layout], [c for _, c, _ in self.layout], self.target)
        cu = query_start_loc([self.layout[i][2] for i in order])
        for b, j in enumerate(order):
            sid, c, _ = self.layout[j]
            s = out.scheduled[j]
            kept = s.num_committed + (len(emitted[j]) - 1 if j in emitted else 0)
            new = hidden[cu[b]:cu[b] + kept]
            first, f = self.features.get(sid, (c, new[:0]))
            if not first <= c <= first + len(f):  # a gap (recompute, fork): start again from here
                first, f = c, new[:0]
            f = torch.cat([f[:c - first], new])
            keep_from = max(first, self.num_computed.get(sid, 0) - 1)  # the draft still needs f_{seen-1} on
            self.features[sid] = (keep_from, f[keep_from - first:])
        live = {seq.seq_id for seq in running}
        self.num_computed = {sid: n for sid, n in self.num_computed.items() if sid in live}
        self.features = {sid: f for sid, f in self.features.items() if sid in live}
