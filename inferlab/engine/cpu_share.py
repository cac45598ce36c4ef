"""Threads on a shared CPU: run on the cores other programs leave free.

Every parallel loop of a decode step (torch's ops, MKL's products, the decode loops in C) splits
its work over the threads and then waits for the slowest. On a two-core laptop where another
program keeps one core busy, the second thread runs only when the scheduler lends it that core,
and every one of a token's ~120 loops waits for it. Measured on smollm2 with one core busy: fp32
took 36-47 ms a token on 2 threads and 21-23 ms on 1; INT8 19-49 ms against 12-13 ms.

So the engine looks, at most once a second, at how much CPU time other processes used since it
last looked (Linux's ``/proc/stat`` for the machine, minus ``os.times()`` for this process, whose
own threads, spinning ones included, are not "others"), and runs on the cores left:
never more threads than it was given (``torch.set_num_threads`` or ``OMP_NUM_THREADS``), never
fewer than one. Where ``/proc`` is missing (macOS, Windows) it keeps its threads.
``INFERLAB_CPU_SHARE=0`` turns it off (benchmarks that compare engines at fixed threads).
"""
from __future__ import annotations

import os
import time

import torch

#: Seconds between two looks: the window the other processes' load is averaged over.
INTERVAL = 1.0


def enabled() -> bool:
    return os.environ.get("INFERLAB_CPU_SHARE", "1") != "0"


def free_cores(others_busy: float, cores: int) -> int:
    """Cores left when other processes kept ``others_busy`` cores busy (a core counts as taken from
    a half up), at least one."""
    return max(1, cores - int(others_busy + 0.5))


def _machine_busy() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (all cores), or None without /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_busy() -> float:
    t = os.times()
    return t.user + t.system


class CpuShare:
    """Call ``adjust()`` before each step: it sets torch's threads to the free cores, never above the
    count it found (or that the user set since)."""

    def __init__(self):
        self.given = torch.get_num_threads()
        self.set_to: int | None = None   # what we last set, to notice a user's own change
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.last = None                 # (wall, machine busy, own busy) at the last look

    def adjust(self) -> int:
        now = torch.get_num_threads()
        if self.set_to is not None and now != self.set_to:  # the user chose another count: the new ceiling
            self.given, self.set_to = now, None
        if not enabled() or self.given <= 1:
            return now
        wall = time.monotonic()
        if self.last is not None and wall - self.last[0] < INTERVAL:  # before reading /proc: a step can be
            return now                                                # shorter than the read (~70 us)
        machine = _machine_busy()
        if machine is None:
            return now
        own = _own_busy()
        if self.last is None:
            self.last = (wall, machine, own)
            return now
        dt = wall - self.last[0]
        others = max(0.0, (machine - self.last[1]) - (own - self.last[2])) / dt
        self.last = (wall, machine, own)
        want = min(self.given, free_cores(others, self.cores))
        if want != now:
            torch.set_num_threads(want)
            self.set_to = want
        return want


_shared: CpuShare | None = None


def adjust() -> int:
    """``CpuShare.adjust`` on the one instance of this process: every engine in it (the capstone
    builds one per deployment) shares the thread count, so none mistakes another's change for the
    user's."""
    global _shared
    if _shared is None:
        _shared = CpuShare()
    return _shared.adjust()
