"""Scheduling policies: one step of the scheduler, written with its primitives.

``continuous`` is iteration-level scheduling (Orca, vLLM): sequences join and leave the batch at
every step. ``static`` admits a batch and runs it until its longest request ends, the way a
server without an iteration-level scheduler batches requests; it runs on the same code so the
two can be compared fairly (``inferlab.bench.serve``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from inferlab.engine.sched_output import SchedulerOutput

if TYPE_CHECKING:  # the scheduler imports this module to pick its policy; annotations only here
    from inferlab.engine.scheduler import Scheduler


class SchedulingPolicy(ABC):
    @abstractmethod
    def schedule(self, s: "Scheduler") -> SchedulerOutput:
        """Pick this step's sequences and token counts; preempt when the KV pool runs dry."""


def schedule_running(s: "Scheduler", out: SchedulerOutput, budget: int) -> int:
    """Running sequences, oldest first, each gets its next tokens; when blocks run out the newest
    running sequence is preempted (possibly the one being scheduled). Returns the budget left."""
    i = 0
    while i < len(s.running) and budget > 0:
        seq = s.running[i]
        k = s.num_new_tokens(seq, budget)
        if k == 0:
            break
        while not s.grow(seq, seq.num_computed_tokens + k, out):
            if seq.spec_token_ids:  # guesses are optional: drop them before preempting anyone
                k -= len(seq.spec_token_ids)
                seq.spec_token_ids = []
                s.block_manager.truncate(seq.seq_id, seq.num_computed_tokens + k)
                continue
            victim = s.running[-1]  # the newest; never one already scheduled (those are older)
            s.preempt(victim, out)
            if victim is seq:
                return budget
        out.add(seq, k)
        budget -= k
        i += 1
    return budget


class ContinuousPolicy(SchedulingPolicy):
    def schedule(self, s: "Scheduler") -> SchedulerOutput:
        out = SchedulerOutput()
        budget = schedule_running(s, out, s.max_num_batched_tokens)
        if out.preempted:  # the pool is short: admitting now would only preempt again
            return out
        while s.waiting and budget > 0:  # first come, first served: stop at the first that waits
            k = s.admit(s.waiting[0], budget, out)
            if k == 0:
                break
            budget -= k
        return out


class StaticPolicy(SchedulingPolicy):
    """Admission opens when the batch has drained and closes once the batch is formed (full,
    nothing waiting, or the pool short); until then only the admitted sequences run."""

    def __init__(self):
        self.batch_open = True

    def schedule(self, s: "Scheduler") -> SchedulerOutput:
        out = SchedulerOutput()
        if not s.running:
            self.batch_open = True
        budget = schedule_running(s, out, s.max_num_batched_tokens)
        while self.batch_open and s.waiting and budget > 0 and not out.preempted:
            k = s.admit(s.waiting[0], budget, out)
            if k == 0:
                break
            budget -= k
        full = len(s.running) >= s.max_num_seqs or not s.waiting
        if out.preempted or full or (s.waiting and budget > 0):  # formed (or blocked by the pool)
            self.batch_open = False
        return out


POLICIES: dict[str, type[SchedulingPolicy]] = {"continuous": ContinuousPolicy, "static": StaticPolicy}


def get_policy(name: str) -> SchedulingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler_policy {name!r}: choose one of {', '.join(POLICIES)}")
    return POLICIES[name]()
