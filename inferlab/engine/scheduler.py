"""The scheduler: which sequences run in the next forward, and how many tokens each.

Iteration-level scheduling (Orca, Yu et al. OSDI'22; vLLM): the batch is re-formed at *every*
step. A request that finishes leaves at once and a waiting one takes its place, instead of
the whole batch waiting for its longest member (static batching). Each step has a *token
budget* (``max_num_batched_tokens``) and a cap on sequences (``max_num_seqs``):

* running sequences go first, oldest first: a decode costs 1 token, plus its speculative guesses
  (``spec_token_ids``), trimmed so that every running sequence still gets its token; a prompt
  being prefilled in chunks (``enable_chunked_prefill``) costs the next chunk (Sarathi-Serve,
  Agrawal et al. 2024);
* then waiting sequences are admitted, first come first served, while budget, sequence slots
  and KV blocks last;
* when the KV pool runs dry, the newest running sequence is *preempted*: its blocks are freed and
  it goes back to the front of the waiting queue, to be recomputed later (vLLM's recompute).

``scheduling_policy`` (vLLM's name) orders the queues. ``"fcfs"``: as above, arrival order.
``"priority"``: each request carries a ``priority`` (lower is served first, ties by arrival);
both queues are kept in (priority, arrival) order, so the last running sequence, the one
preempted first, is the lowest-priority newest one (vLLM v1's victim:
``max(running, key=(priority, arrival_time))``). The policy then serves one priority level at a
time (``policy.py``).

The policy (``policy.py``) writes the step with the primitives below: ``num_new_tokens``,
``grow`` (blocks for more tokens), ``preempt`` and ``admit``.
"""
from __future__ import annotations

import bisect
from collections import deque

from inferlab.engine.block_manager import BlockManager, NoFreeBlocksError
from inferlab.engine.policy import get_policy
from inferlab.engine.request import EngineSequence
from inferlab.engine.sched_output import ScheduledSeq, SchedulerOutput
from inferlab.sequence import SequenceStatus

__all__ = ["Scheduler", "SchedulerOutput", "ScheduledSeq"]


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = False, policy: str = "continuous",
                 scheduling_policy: str = "fcfs"):
        self.block_manager = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = get_policy(policy)
        self.by_priority = scheduling_policy == "priority"
        self.waiting: deque[EngineSequence] = deque()
        self.running: list[EngineSequence] = []
        self.num_preemptions = 0

    def add(self, seq: EngineSequence) -> None:
        seq.status = SequenceStatus.WAITING
        self._enqueue(self.waiting, seq)

    # ---- the queues' order --------------------------------------------------------------------
    def level(self, seq: EngineSequence) -> int:
        """The priority level ``seq`` is served at: its priority, or 0 for all under "fcfs"."""
        return seq.priority if self.by_priority else 0

    def levels(self) -> list[int]:
        """The levels present in the queues, most urgent first (one, [0], under "fcfs")."""
        return sorted({self.level(q) for q in (*self.running, *self.waiting)})

    def _enqueue(self, queue: deque, seq: EngineSequence, front: bool = False) -> None:
        """Put ``seq`` in ``queue``: at its (priority, arrival) place under "priority"; else at the
        back, or at the front for a preempted sequence (vLLM's prepend: it was already running)."""
        if self.by_priority:
            bisect.insort(queue, seq, key=lambda q: (q.priority, q.arrival_time, q.seq_id))
        elif front:
            queue.appendleft(seq)
        else:
            queue.append(seq)

    def victim(self) -> EngineSequence:
        """The running sequence to preempt first: the last one, which is the newest admitted under
        "fcfs" and, the queue being kept in that order, the lowest-priority newest under "priority"."""
        return self.running[-1]

    def schedule(self) -> SchedulerOutput:
        self.fit_spec_tokens()
        return self.policy.schedule(self)

    def fit_spec_tokens(self) -> None:
        """Trim the guesses so that they only use budget no running sequence needs: each running
        sequence is owed one token, the rest goes to guesses, oldest sequence first."""
        spare = self.max_num_batched_tokens - len(self.running)
        for seq in self.running:
            keep = max(0, min(len(seq.spec_token_ids), spare))
            del seq.spec_token_ids[keep:]
            spare -= keep

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- primitives the policies are written with -------------------------------------------
    def num_new_tokens(self, seq: EngineSequence, budget: int) -> int:
        """Tokens ``seq`` would compute now under ``budget``: all that remain, or a chunk (0: wait).
        A decode's guesses count too, as many as the budget leaves after its own token (a query:
        the guesses past that stay on the sequence, and ``SchedulerOutput.add`` schedules only
        those the count covers)."""
        guesses = min(len(seq.spec_token_ids), max(budget - 1, 0))
        remaining = seq.num_tokens + guesses - seq.num_computed_tokens
        if self.enable_chunked_prefill:
            return min(remaining, budget)
        return remaining if remaining <= budget else 0

    def grow(self, seq: EngineSequence, end: int, out: SchedulerOutput) -> bool:
        """Extend ``seq``'s block table to cover its first ``end`` tokens. False when the pool ran
        dry (the slots obtained so far are kept); copy-on-write pairs go to ``out.copies``."""
        bm, sid = self.block_manager, seq.seq_id
        try:
            for _ in range(end - bm.num_tokens(sid)):
                out.copies += bm.append_slot(sid)
        except NoFreeBlocksError:
            return False
        return True

    def drop_guesses(self, seq: EngineSequence) -> int:
        """Forget ``seq``'s guesses and the slots grown for them (the pool ran short: guesses are
        optional). Returns how many there were."""
        dropped = len(seq.spec_token_ids)
        seq.spec_token_ids = []
        if self.block_manager.num_tokens(seq.seq_id) > seq.num_tokens:
            self.block_manager.truncate(seq.seq_id, seq.num_tokens)
        return dropped

    def preempt(self, seq: EngineSequence, out: SchedulerOutput) -> None:
        """Free ``seq``'s blocks and put it back in the waiting queue, at the front (under "priority":
        at its priority's place) to be recomputed later."""
        table = set(self.block_manager.block_table(seq.seq_id))
        out.copies = [(s, d) for s, d in out.copies if d not in table]
        self.block_manager.free(seq.seq_id)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        self._enqueue(self.waiting, seq, front=True)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def admit(self, seq: EngineSequence, budget: int, out: SchedulerOutput) -> int:
        """Move the waiting ``seq`` to running and schedule its first tokens; returns how many
        (0: it does not fit now, nothing changed). Prefix-cache hits are not computed again, unless
        the request wants prompt log-probs not computed yet: cached blocks have no logits."""
        reserved = len(self.running) + sum(s.num_pending_forks for s in self.running)  # n > 1 siblings to come
        if reserved + 1 + seq.num_pending_forks > self.max_num_seqs:
            return 0
        first = self.num_new_tokens(seq, budget)
        if first == 0 or not self.block_manager.can_allocate(first):
            return 0
        try:
            cached = self.block_manager.allocate(seq.seq_id, seq.token_ids(0, first),
                                                 lookup=not seq.needs_prompt_logits)
        except NoFreeBlocksError:
            return 0
        seq.num_computed_tokens = cached
        self.grow(seq, min(seq.num_tokens, cached + budget), out)  # cache hits leave budget for more
        k = self.block_manager.num_tokens(seq.seq_id) - cached
        self.waiting.remove(seq)
        self._enqueue(self.running, seq)
        seq.status = SequenceStatus.RUNNING
        out.add(seq, k)
        return k

    # ---- the engine's calls after a step ------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, num_accepted: list[int] | None = None) -> None:
        """The step ran: each scheduled sequence has its new tokens' K/V written. Advance its
        ``num_computed_tokens`` over its own tokens and the ``num_accepted[i]`` guesses the
        verifier kept; the slots of rejected guesses are given back (rollback: they hold K/V of
        tokens the sequence never had, and are overwritten when it grows again). Then name its
        blocks that are now full of computed K/V (only now: see block_manager.py), so a rejected
        guess never enters the prefix cache. Not called when the forward raised."""
        bm = self.block_manager
        for i, s in enumerate(out.scheduled):
            seq = s.seq
            seq.num_computed_tokens += s.num_committed + (num_accepted[i] if num_accepted else 0)
            n = seq.num_computed_tokens
            if bm.num_tokens(seq.seq_id) > n:
                bm.truncate(seq.seq_id, n)
            if bm.enable_prefix_caching and n - bm.num_cached_tokens(seq.seq_id) >= bm.block_size:
                bm.cache_blocks(seq.seq_id, seq.token_ids(0, n))  # a block filled up (kept guesses among them)
            seq.spec_token_ids = []

    def fork(self, parent: EngineSequence, child: EngineSequence) -> None:
        self.block_manager.fork(parent.seq_id, child.seq_id)
        child.status = SequenceStatus.RUNNING
        self._enqueue(self.running, child)

    def finish(self, seq: EngineSequence) -> None:
        """A finished or aborted sequence leaves its queue and returns its blocks."""
        if seq in self.running:
            self.running.remove(seq)
            self.block_manager.free(seq.seq_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
