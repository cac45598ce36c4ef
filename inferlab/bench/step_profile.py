"""Where an engine step's time goes: the forward against everything around it.

Leviathan's formula prices a speculative step in target forwards: k draft passes of cost c and
one verify of k + 1 rows of cost v. The step of a real engine also proposes, schedules, lays out
the ragged batch, verifies and appends token by token in Python, and the formula sees none of
that. :func:`profile_steps` times each part of ``LLMEngine.step`` by wrapping the objects the
step calls (nothing in the engine changes), and :func:`engine_terms` turns two profiles, one
run without speculation and one with it, into the formula's terms measured on the engine's own
paged path, so a gap between the measured and predicted speedup is the overhead the breakdown
names.

vLLM v1 keeps most of this off the host: its rejection sampler is a GPU kernel and an EAGLE
drafter's forwards run on the GPU (CUDA graphs included), so the host schedules and, for n-gram,
looks up; a step's Python is hidden behind the device's work. Here everything runs on one CPU,
one part after the other, so each part adds to the step; the breakdown shows how much (on
smollm2 in fp32, about 1 ms around a forward of 50-60 ms).

Phases of a step (seconds summed over the decode steps, prefill steps left out):

    propose    the proposer's guesses (before scheduling)   fill      draft passes after it
    schedule   the scheduler                                  forward   the runner: layout + model
    verify     acceptance from the logits                     update    roll back, name blocks
    observe    what the proposer learns from the kept rows    python    the rest: outputs, appends
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict

import inferlab.engine.llm_engine as _llm_engine
from inferlab.spec.rejection import mixed_speedup

PHASES = ("propose", "fill", "schedule", "forward", "verify", "update", "observe", "python")


#: A decode step that took this many times its run's median step of the same kind is a stall: on a
#: shared CPU another program took a core in the middle of the step, before the engine's thread
#: share (``engine/cpu_share.py``) could drop a thread, and each of the step's ~180 parallel loops
#: waited for the descheduled thread (1-3 s for a 20-30 ms step, measured on smollm2 in a notebook
#: beside a busy core). The steps of one kind vary far less (at batch 16, under 2x the median as
#: sequences finish), so a stall is counted at the median instead: one stall in one run would
#: otherwise decide a comparison of two runs. ``StepProfile.stalled`` counts them.
STALL = 5.0


class StepProfile:
    """Seconds per phase of each step, kept separately for decode steps without guesses ("plain"),
    decode steps with them ("spec") and prefill steps ("prefill")."""

    def __init__(self):
        self.records: dict[str, list[dict[str, float]]] = defaultdict(list)
        self._now: dict[str, float] = {}
        self._kind = "plain"

    @property
    def steps(self) -> dict[str, int]:
        return defaultdict(int, {kind: len(r) for kind, r in self.records.items()})

    @property
    def seconds(self) -> dict[str, dict[str, float]]:
        """Seconds per phase summed over the steps of each kind, as measured (stalls included)."""
        out = {kind: defaultdict(float) for kind in ("plain", "spec", "prefill")}
        for kind, recs in self.records.items():
            for r in recs:
                for p, v in r.items():
                    out[kind][p] += v
        return out

    def _scales(self, kind: str) -> list[float]:
        """Each step's weight: 1, or median / its time for a stall (see :data:`STALL`)."""
        totals = [sum(r.values()) for r in self.records[kind]]
        if not totals:
            return []
        m = statistics.median(totals)
        return [m / t if t > STALL * m > 0 else 1.0 for t in totals]

    def stalled(self, kind: str) -> int:
        """Steps of ``kind`` counted at the median as stalls."""
        return sum(w < 1.0 for w in self._scales(kind))

    def per_step(self, kind: str) -> dict[str, float]:
        """Mean seconds per step of each phase, over the steps of ``kind`` (a stall at the median)."""
        n = max(len(self.records[kind]), 1)
        out = dict.fromkeys(PHASES, 0.0)
        for w, r in zip(self._scales(kind), self.records[kind]):
            for p, v in r.items():
                out[p] += w * v
        return {p: v / n for p, v in out.items()}

    def decode_seconds(self) -> float:
        """The decode steps' seconds (a stall at the median)."""
        return sum(sum(self.per_step(k).values()) * len(self.records[k]) for k in ("plain", "spec"))


def _step_kind(seqs, num_logits) -> str:
    if any(len(s.token_ids) > (n if num_logits else 1) for s, n in zip(seqs, num_logits or [1] * len(seqs))):
        return "prefill"
    return "spec" if num_logits and any(n > 1 for n in num_logits) else "plain"


@contextlib.contextmanager
def profile_steps(engine):
    """Time every phase of ``engine.step()`` while the block runs; yields a :class:`StepProfile`."""
    prof = StepProfile()
    undo = []

    def wrap(owner, name, phase, classify=False):
        if owner is None:
            return
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if classify:
                prof._kind = _step_kind(args[0], kwargs.get("num_logits"))
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                prof._now[phase] = prof._now.get(phase, 0.0) + time.perf_counter() - t

        undo.append((owner, name, name in vars(owner), inner))
        setattr(owner, name, timed)

    for owner, name, phase in ((engine.proposer, "propose", "propose"), (engine.proposer, "fill", "fill"),
                               (engine.proposer, "observe", "observe"), (engine.scheduler, "schedule", "schedule"),
                               (engine.scheduler, "update_from_output", "update"), (_llm_engine, "verify", "verify")):
        wrap(owner, name, phase)
    wrap(engine.runner, "execute", "forward", classify=True)
    step = engine.step

    def timed_step():
        prof._now, prof._kind = {}, "plain"
        t = time.perf_counter()
        out = step()
        total = time.perf_counter() - t
        if "forward" in prof._now:  # a step that ran the model
            prof.records[prof._kind].append({**prof._now, "python": total - sum(prof._now.values())})
        return out

    engine.step = timed_step
    try:
        yield prof
    finally:
        del engine.step
        for owner, name, had, inner in reversed(undo):
            if had:  # a module's function: put it back
                setattr(owner, name, inner)
            else:  # a bound method shadowed on the instance: the class's shows again
                delattr(owner, name)


def engine_terms(plain: StepProfile, spec: StepProfile, plain_counters: dict, spec_counters: dict) -> dict:
    """Leviathan's terms measured on the engine itself (at batch 1; at a larger batch a step's, with
    f counting steps in which any sequence had guesses), from a run without
    speculation (``plain``) and one with it (``spec``; each with its engine's ``counters``):
    the decode forward t1 (seconds), v (a verify forward over t1), k c (the proposer's own work
    per step with guesses, over t1), the share f of decode steps that had guesses, L (tokens per
    such step), w (the speculative run's own steps without guesses over t1: 1 on a steady machine;
    these CPUs are shared, and a run that finds the machine slower pays that on every step, which
    w carries into the prediction) and the speedup the formula predicts for that mix of steps,

        (f L + (1 - f)) / (f (k c + v) + (1 - f) w),

    beside the decode speedup measured (tokens per decode second, against the plain run's; a step
    that stalled counts at its run's median, :data:`STALL`, and ``stalled_steps`` says how many);
    ``plain_step_s`` and ``spec_step_s`` hold every phase per step, where the rest of a gap goes."""
    t1 = plain.per_step("plain")["forward"]
    with_guesses, without = spec.steps["spec"], spec.steps["plain"]
    length = 1 + spec_counters["spec_decode_num_accepted_tokens"] / max(spec_counters["spec_decode_num_drafts"], 1)
    f = with_guesses / max(with_guesses + without, 1)
    per = spec.per_step("spec")
    v = per["forward"] / t1 if with_guesses else 1.0
    kc = (per["propose"] + per["fill"] + per["observe"]) / t1 if with_guesses else 0.0
    w = spec.per_step("plain")["forward"] / t1 if without else 1.0
    rate = lambda prof, c: c["decode_tokens"] / max(prof.decode_seconds(), 1e-12)  # noqa: E731
    return {"decode_forward_s": t1, "verify_cost_ratio": v, "draft_cost_per_step": kc,
            "share_of_steps_with_guesses": f, "mean_acceptance_length": length, "plain_step_ratio": w,
            "predicted_decode_speedup": mixed_speedup(f, length, kc, v, w),
            "measured_decode_speedup": rate(spec, spec_counters) / rate(plain, plain_counters),
            "stalled_steps": {"plain_run": plain.stalled("plain"), "spec_run": spec.stalled("plain") + spec.stalled("spec")},
            "plain_step_s": plain.per_step("plain"), "spec_step_s": per,
            "spec_plain_step_s": spec.per_step("plain")}
