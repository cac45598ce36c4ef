"""The engine runs on the cores other programs leave free (engine/cpu_share.py)."""
import subprocess
import sys
import time

import pytest
import torch

from inferlab.engine import cpu_share
from inferlab.engine.cpu_share import CpuShare, free_cores


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class Clock:
    """Stands in for the machine's and this process's CPU counters."""

    def __init__(self, monkeypatch):
        self.wall = self.machine = self.own = 0.0
        monkeypatch.setattr(cpu_share.time, "monotonic", lambda: self.wall)
        monkeypatch.setattr(cpu_share, "_machine_busy", lambda: self.machine)
        monkeypatch.setattr(cpu_share, "_own_busy", lambda: self.own)

    def run(self, seconds, own_cores, other_cores):
        self.wall += seconds
        self.own += seconds * own_cores
        self.machine += seconds * (own_cores + other_cores)


def test_free_cores():
    assert [free_cores(x, 2) for x in (0.0, 0.4, 0.6, 1.0, 1.9, 5.0)] == [2, 2, 1, 1, 1, 1]
    assert free_cores(1.0, 8) == 7


def test_a_busy_core_elsewhere_takes_a_thread_and_gives_it_back(monkeypatch, threads):
    clock, share = Clock(monkeypatch), CpuShare()
    share.cores = 2
    share.adjust()
    clock.run(1.5, own_cores=2.0, other_cores=0.0)   # our own two busy threads are not "others"
    assert share.adjust() == 2 and torch.get_num_threads() == 2
    clock.run(1.5, own_cores=1.0, other_cores=1.0)
    assert share.adjust() == 1 and torch.get_num_threads() == 1
    clock.run(0.5, own_cores=1.0, other_cores=0.0)   # under a second since the last look: no change
    assert share.adjust() == 1
    clock.run(1.0, own_cores=1.0, other_cores=0.0)
    assert share.adjust() == 2 and torch.get_num_threads() == 2


def test_proc_is_read_once_a_second_not_once_a_step(monkeypatch, threads):
    """A toy model's decode step (about half a millisecond) is shorter than reading /proc/stat: the
    engine's steps between two looks read nothing."""
    clock, share = Clock(monkeypatch), CpuShare()
    share.cores = 2
    reads = []
    monkeypatch.setattr(cpu_share, "_machine_busy", lambda: reads.append(1) or clock.machine)
    share.adjust()
    for _ in range(100):
        clock.run(0.005, own_cores=2.0, other_cores=0.0)
        share.adjust()
    assert len(reads) == 1  # 0.5 s of steps: only the first look
    clock.run(0.6, own_cores=2.0, other_cores=0.0)
    share.adjust()
    assert len(reads) == 2


def test_never_above_what_it_was_given(monkeypatch, threads):
    clock, share = Clock(monkeypatch), CpuShare()
    share.cores = 4
    share.adjust()
    clock.run(1.5, own_cores=2.0, other_cores=0.0)
    assert share.adjust() == 2                        # 4 cores free, 2 threads given
    clock.run(1.5, own_cores=2.0, other_cores=3.0)
    assert share.adjust() == 1
    clock.run(1.5, own_cores=1.0, other_cores=0.0)
    assert share.adjust() == 2
    torch.set_num_threads(1)                           # the user's own choice is the new ceiling
    clock.run(1.5, own_cores=1.0, other_cores=0.0)
    assert share.adjust() == 1 and torch.get_num_threads() == 1


def test_switched_off(monkeypatch, threads):
    monkeypatch.setenv("INFERLAB_CPU_SHARE", "0")
    clock, share = Clock(monkeypatch), CpuShare()
    share.cores = 2
    share.adjust()
    clock.run(1.5, own_cores=1.0, other_cores=1.0)
    assert share.adjust() == 2 and torch.get_num_threads() == 2


@pytest.mark.skipif(not cpu_share._machine_busy(), reason="no /proc/stat here")
def test_a_real_busy_process_is_seen(threads):
    share = CpuShare()
    share.cores = 2
    share.adjust()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.3)
        assert share.adjust() == 1
    finally:
        busy.kill()
        busy.wait()


def test_every_engine_of_a_process_shares_one_count(monkeypatch, threads):
    """The capstone builds an engine per deployment, some while the count is lowered: each must
    still give the cores back when the other program stops."""
    clock = Clock(monkeypatch)
    monkeypatch.setattr(cpu_share, "_shared", None)
    cpu_share.adjust()
    cpu_share._shared.cores = 2
    clock.run(1.5, own_cores=1.0, other_cores=1.0)
    assert cpu_share.adjust() == 1                     # one engine's step, another program busy
    clock.run(1.5, own_cores=1.0, other_cores=0.0)
    assert cpu_share.adjust() == 2                     # a later engine's step, the program gone
