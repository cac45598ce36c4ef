"""Batching policies (`batching_policy`): one step of the scheduler, written with its primitives.

``continuous`` is iteration-level scheduling (Orca, vLLM): sequences join and leave the batch at
every step. ``static`` admits a batch and runs it until its longest request ends, the way a
server without an iteration-level scheduler batches requests; it runs on the same code so the
two can be compared fairly (``inferlab.bench.serve``).

Under ``scheduling_policy="priority"`` the continuous policy serves one priority level at a time,
most urgent first: the level's running sequences, then its waiting ones. A sequence short of KV
blocks preempts the lowest-priority newest running one (vLLM v1's rule), and a waiting sequence
that cannot be admitted preempts running ones of a lower priority to make room (vLLM v0's
priority preemption). So a level never waits for a lower one, and a request's schedule does not
change when lower-priority work shares the engine: background jobs get only what is left.
Under "fcfs" there is one level and this is the plain continuous policy.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from inferlab.engine.request import EngineSequence
from inferlab.engine.sched_output import SchedulerOutput


class SchedulerView(Protocol):
    """What a policy sees of the scheduler (``inferlab.engine.scheduler.Scheduler``): its queues, to
    read, and the primitives that change them. A policy never edits the queues or the block manager
    itself, so each rule (the token budget, guesses, preemption order) has one owner there."""
    running: Sequence[EngineSequence]
    waiting: Sequence[EngineSequence]
    max_num_seqs: int
    max_num_batched_tokens: int
    by_priority: bool

    def level(self, seq: EngineSequence) -> int: ...
    def levels(self) -> list[int]: ...
    def victim(self) -> EngineSequence: ...
    def num_new_tokens(self, seq: EngineSequence, budget: int) -> int: ...
    def grow(self, seq: EngineSequence, end: int, out: SchedulerOutput) -> bool: ...
    def drop_guesses(self, seq: EngineSequence) -> int: ...
    def preempt(self, seq: EngineSequence, out: SchedulerOutput) -> None: ...
    def admit(self, seq: EngineSequence, budget: int, out: SchedulerOutput) -> int: ...


class BatchingPolicy(ABC):
    @abstractmethod
    def schedule(self, s: SchedulerView) -> SchedulerOutput:
        """Pick this step's sequences and token counts; preempt when the KV pool runs dry."""


def schedule_running(s: SchedulerView, out: SchedulerOutput, budget: int, level: int | None = None) -> int:
    """Running sequences (of ``level``; None: all), oldest first, each gets its next tokens; when
    blocks run out the scheduler's victim (``Scheduler.victim``: the newest, or the lowest priority)
    is preempted, possibly the one being scheduled. Returns the budget left."""
    i = 0 if level is None else sum(s.level(q) < level for q in s.running)  # where the level starts
    while i < len(s.running) and budget > 0:
        seq = s.running[i]
        if level is not None and s.level(seq) != level:
            break
        k = s.num_new_tokens(seq, budget)
        if k == 0:
            break
        while not s.grow(seq, seq.num_computed_tokens + k, out):
            if s.drop_guesses(seq):  # guesses are optional: drop them before preempting anyone
                k = s.num_new_tokens(seq, budget)
                continue
            victim = s.victim()  # the last running: never one already scheduled (those come before)
            s.preempt(victim, out)
            if victim is seq:
                return budget
        out.add(seq, k)
        budget -= k
        i += 1
    return budget


def admit_waiting(s: SchedulerView, out: SchedulerOutput, budget: int, level: int | None = None) -> int:
    """Admit waiting sequences (of ``level``; None: all) in queue order while they fit; stop at the
    first that does not (no one overtakes it). Under "priority", one that does not fit preempts
    running sequences of a lower priority first (their blocks and slots), then tries again."""
    for seq in [q for q in s.waiting if level is None or s.level(q) == level]:
        if budget <= 0:
            break
        k = s.admit(seq, budget, out)
        while (k == 0 and s.by_priority and s.running and s.level(s.victim()) > s.level(seq)
               and s.num_new_tokens(seq, budget) > 0):  # short of slots or blocks, not of budget
            s.preempt(s.victim(), out)  # a lower level, not scheduled yet this step: nothing to undo
            k = s.admit(seq, budget, out)
        if k == 0:
            break
        budget -= k
    return budget


class ContinuousPolicy(BatchingPolicy):
    def schedule(self, s: SchedulerView) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = s.max_num_batched_tokens
        for level in s.levels():  # one level under "fcfs"
            budget = schedule_running(s, out, budget, level)
            # a preemption at this level or a more urgent one: the pool is short for this level,
            # admitting now would only preempt again (under "fcfs": any preemption stops admission)
            if any(s.level(q) <= level for q in out.preempted):
                continue
            budget = admit_waiting(s, out, budget, level)
        return out


class StaticPolicy(BatchingPolicy):
    """Admission opens when the batch has drained and closes once the batch is formed (full,
    nothing waiting, or the pool short); until then only the admitted sequences run."""

    def __init__(self):
        self.batch_open = True

    def schedule(self, s: SchedulerView) -> SchedulerOutput:
        out = SchedulerOutput()
        if not s.running:
            self.batch_open = True
        budget = schedule_running(s, out, s.max_num_batched_tokens)
        if self.batch_open and not out.preempted:
            budget = admit_waiting(s, out, budget)
        full = len(s.running) >= s.max_num_seqs or not s.waiting
        if out.preempted or full or (s.waiting and budget > 0):  # formed (or blocked by the pool)
            self.batch_open = False
        return out


POLICIES: dict[str, type[BatchingPolicy]] = {"continuous": ContinuousPolicy, "static": StaticPolicy}


def check_name(name: str) -> str:
    """``name`` if it names a batching policy, else the one-line ValueError every caller gives."""
    if name not in POLICIES:
        raise ValueError(f"unknown batching_policy {name!r}: choose one of {', '.join(POLICIES)}")
    return name


def get_policy(name: str) -> BatchingPolicy:
    return POLICIES[check_name(name)]()
