"""Lab 05: the continuous-batching scheduler. Write the two pieces marked TODO.

At every engine step the scheduler picks which sequences run and how many tokens each computes
(a whole prompt, a chunk of one, or the one token of a decode), under two limits:

    s.max_num_batched_tokens   the token budget of one step
    s.max_num_seqs             how many sequences may be running at once

Continuous batching (Orca, vLLM) re-forms the batch at every step:

1. running sequences first, oldest first (``s.running`` is in that order): each gets its next
   tokens while the budget lasts. If the KV pool has no block for them, preempt the NEWEST
   running sequence (``s.running[-1]``) and try again; if the newest is the very sequence being
   scheduled, it is preempted and the step stops there;
2. then, unless something was preempted this step (the pool is short: admitting would only
   preempt again), admit waiting sequences first come, first served (``s.waiting[0]``), and stop
   at the first one that does not fit: never let a later, smaller request jump the queue.

The scheduler ``s`` (``inferlab.engine.scheduler.Scheduler``) gives you its primitives:

    s.num_new_tokens(seq, budget)  tokens seq would compute now: all that remain, or with chunked
                                   prefill as many as the budget allows; 0: it cannot run now
    s.grow(seq, end, out)          get KV slots for seq's first ``end`` tokens; False: pool empty
    s.preempt(seq, out)            free seq's blocks, put it at the front of s.waiting
    s.admit(seq, budget, out)      waiting -> running with its first tokens scheduled; returns how
                                   many (0: no sequence slot, budget or blocks for it; nothing changed)
    out.add(seq, k)                schedule k tokens of seq in this step
    out.scheduled                  what was scheduled so far this step (each .seq, .num_new_tokens)
    out.preempted                  the sequences preempted so far this step (empty list: none)
    seq.num_computed_tokens        tokens of seq whose K/V are already in the cache

Grade your work with `inferlab grade labs/05_continuous_batching`. Keep the names and signatures.
"""
from __future__ import annotations

from inferlab.engine.policy import BatchingPolicy
from inferlab.engine.scheduler import Scheduler, SchedulerOutput


def schedule_running(s: Scheduler, out: SchedulerOutput, budget: int) -> int:
    """Schedule the running sequences, oldest first, within ``budget`` tokens; preempt the newest
    running sequence whenever the pool has no block left. Returns the budget left over."""
    # TODO: walk s.running in order while budget > 0; k = s.num_new_tokens(seq, budget), stop at 0;
    #       while not s.grow(seq, seq.num_computed_tokens + k, out): preempt s.running[-1]
    #       (return at once if that was seq); then out.add(seq, k) and spend k of the budget.
    #       Careful: preempting removes a sequence from s.running while you walk it.
    raise NotImplementedError("about 14 lines")


class ContinuousPolicy(BatchingPolicy):
    def schedule(self, s: Scheduler) -> SchedulerOutput:
        """One step: the running sequences, then first-come-first-served admissions."""
        # TODO: out = SchedulerOutput(); budget = schedule_running(s, out, s.max_num_batched_tokens);
        #       no admissions after a preemption; admit s.waiting[0] while budget and s.waiting last,
        #       stopping at the first that does not fit.
        raise NotImplementedError("about 9 lines")
