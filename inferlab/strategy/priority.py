"""Request priorities and background precompute on the engine.

vLLM's ``priority`` scheduling: every request carries a priority (lower value = served first);
the scheduler serves the levels in order and, when the KV pool or the batch is full, preempts the
*lowest-priority* newest request first. ``PriorityPolicy`` plugs that into the engine's
scheduler-policy seam; within one level it is the continuous policy (oldest first, FCFS).

A precompute job (a report whose prompt is known the evening before) runs at ``BACKGROUND``: it
gets only the batch slots, token budget and KV blocks the interactive requests leave free, and it
is preempted the moment they need them, so an interactive request's schedule (its TTFT and TPOT
in steps) is the same with or without the job. Its result waits in a cache and is served at
request time without running the model (``Precompute``).
"""
from __future__ import annotations

import dataclasses

from inferlab.engine.policy import SchedulingPolicy
from inferlab.engine.scheduler import Scheduler, SchedulerOutput

INTERACTIVE, BACKGROUND = 0, 10


class PriorityPolicy(SchedulingPolicy):
    def __init__(self):
        self.priority: dict[str, int] = {}  # request id -> priority (missing: INTERACTIVE)

    def level(self, seq) -> int:
        return self.priority.get(seq.request_id, INTERACTIVE)

    def _victim(self, s: Scheduler):
        """The running sequence to preempt: the lowest priority, and the newest within it."""
        return max(reversed(s.running), key=self.level)  # max keeps the first max: the newest of that level

    def schedule(self, s: Scheduler) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = s.max_num_batched_tokens
        for lvl in sorted({self.level(q) for q in (*s.running, *s.waiting)}):
            stop = False
            for seq in [q for q in s.running if self.level(q) == lvl]:  # oldest first
                if budget <= 0 or seq not in s.running:
                    break
                k = s.num_new_tokens(seq, budget)
                if k == 0:
                    break
                while not s.grow(seq, seq.num_computed_tokens + k, out):
                    victim = self._victim(s)
                    s.preempt(victim, out)
                    if victim is seq:
                        stop = True
                        break
                if stop:
                    break
                out.add(seq, k)
                budget -= k
            # a preemption at this level or above means the pool is short for it: admit nothing more
            if any(self.level(q) <= lvl for q in out.preempted):
                continue
            for seq in [q for q in s.waiting if self.level(q) == lvl]:  # first come, first served
                if budget <= 0:
                    break
                k = s.admit(seq, budget, out)
                while k == 0 and s.running and self.level(self._victim(s)) > lvl:
                    s.preempt(self._victim(s), out)  # make room from a lower priority, then retry
                    k = s.admit(seq, budget, out)
                if k == 0:
                    break
                budget -= k
        return out


def use_priority(engine) -> PriorityPolicy:
    """Switch ``engine`` (an ``LLMEngine``) to priority scheduling; returns the policy (its ``priority`` map)."""
    if engine.has_unfinished_requests():
        raise ValueError("switch the scheduling policy before adding requests")
    policy = PriorityPolicy()
    engine.scheduler.policy = policy
    return policy


def add_request(engine, request_id: str, prompt, params, priority: int = INTERACTIVE) -> None:
    """``engine.add_request`` with vLLM's ``priority`` (the engine must use ``PriorityPolicy``)."""
    policy = engine.scheduler.policy
    if not isinstance(policy, PriorityPolicy):
        raise ValueError("this engine does not schedule by priority: call inferlab.strategy.priority.use_priority(engine) first")
    engine.add_request(request_id, prompt, params)
    policy.priority[str(request_id)] = priority


@dataclasses.dataclass
class Trace:
    """Per request, in engine ticks (one ``step()`` call each): arrival, first token, finish."""
    arrival: dict = dataclasses.field(default_factory=dict)
    first_token: dict = dataclasses.field(default_factory=dict)
    finished: dict = dataclasses.field(default_factory=dict)
    outputs: dict = dataclasses.field(default_factory=dict)
    running: list = dataclasses.field(default_factory=list)  # per tick: the request ids running after it

    def ttft(self, rid) -> int:
        return self.first_token[rid] - self.arrival[rid]

    def tpot(self, rid) -> float:
        n = len(self.outputs[rid].outputs[0].token_ids)
        return (self.finished[rid] - self.first_token[rid]) / max(n - 1, 1)


def run(engine, arrivals: dict[int, list[tuple]], max_ticks: int = 100_000, on_output=None) -> Trace:
    """Drive ``engine`` tick by tick: at tick t add ``arrivals[t]`` (tuples of ``add_request``'s
    arguments after the engine), then step. Runs until every request has finished."""
    trace, last = Trace(), max(arrivals, default=0)
    for tick in range(max_ticks):
        for req in arrivals.get(tick, ()):
            add_request(engine, *req)
            trace.arrival[str(req[0])] = tick
        if tick > last and not engine.has_unfinished_requests():
            return trace
        for out in engine.step():
            if out.request_id not in trace.first_token and out.outputs[0].token_ids:
                trace.first_token[out.request_id] = tick
            if out.finished:
                trace.finished[out.request_id] = tick
                trace.outputs[out.request_id] = out
                if on_output is not None:
                    on_output(out)
        trace.running.append([q.request_id for q in engine.scheduler.running])
    raise RuntimeError(f"requests still running after {max_ticks} ticks: raise max_ticks")


class Precompute:
    """Predictable requests computed ahead at ``BACKGROUND`` priority; served from ``results``."""

    PREFIX = "precompute-"

    def __init__(self):
        self.results: dict[str, str] = {}

    def job(self, key: str, prompt, params) -> tuple:
        """An arrival tuple for :func:`run` (or ``add_request``) that computes ``key`` in the background."""
        return (self.PREFIX + key, prompt, params, BACKGROUND)

    def on_output(self, out) -> None:
        if out.finished and out.request_id.startswith(self.PREFIX):
            self.results[out.request_id[len(self.PREFIX):]] = out.outputs[0].text

    def serve(self, key: str) -> str | None:
        """The precomputed answer, or None (not ready: the caller generates it interactively)."""
        return self.results.get(key)
