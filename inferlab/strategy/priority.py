"""Background precompute on the engine's priority scheduling.

The engine schedules by priority when it is made with ``scheduling_policy="priority"`` (vLLM's
name): every request carries a ``priority`` (lower value = served first, ties by arrival), the
levels are served in order, and when the KV pool or the batch is full the *lowest-priority*
newest request is preempted first (``inferlab.engine.policy``).

A precompute job (a report whose prompt is known the evening before) runs at ``BACKGROUND``: it
gets only the batch slots, token budget and KV blocks the interactive requests leave free, and it
is preempted the moment they need them, so an interactive request's schedule (its TTFT and TPOT
in steps) is the same with or without the job. Its result waits in a cache and is served at
request time without running the model (``Precompute``). ``run`` drives an engine tick by tick
and records each request's schedule in steps.
"""
from __future__ import annotations

import dataclasses

INTERACTIVE, BACKGROUND = 0, 10


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
    """Drive ``engine`` tick by tick: at tick t add ``arrivals[t]``, tuples (request id, prompt,
    params, priority), then step. Runs until every request has finished. A priority other than 0
    needs an engine made with ``scheduling_policy="priority"`` (it says so otherwise)."""
    trace, last = Trace(), max(arrivals, default=0)
    for tick in range(max_ticks):
        for req in arrivals.get(tick, ()):
            rid, prompt, params, priority = req
            engine.add_request(rid, prompt, params, priority=priority)
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
        """An arrival tuple for :func:`run` that computes ``key`` in the background."""
        return (self.PREFIX + key, prompt, params, BACKGROUND)

    def on_output(self, out) -> None:
        if out.finished and out.request_id.startswith(self.PREFIX):
            self.results[out.request_id[len(self.PREFIX):]] = out.outputs[0].text

    def serve(self, key: str) -> str | None:
        """The precomputed answer, or None (not ready: the caller generates it interactively)."""
        return self.results.get(key)
