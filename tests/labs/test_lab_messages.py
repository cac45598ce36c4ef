"""What a student reads when a graded test fails: the steps of a failing state machine, and a
sentence instead of a bare KeyError when a lab 05 policy schedules a sequence it preempted."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from inferlab import labkit


class Counter(RuleBasedStateMachine):
    """A machine whose invariant breaks after three increments: the shortest failing run is known."""

    def __init__(self):
        super().__init__()
        self.n = 0

    @rule()
    def inc(self):
        self.n += 1

    @rule()
    def noop(self):
        pass

    @invariant()
    def small(self):
        labkit.expect(self.n < 3, "the count must stay below 3", n=self.n)


def test_a_failing_state_machine_prints_its_shortest_steps():
    with pytest.raises(labkit.LabError) as info:
        run_state_machine_as_test(Counter, settings=settings(derandomize=True, database=None, print_blob=False,
                                                             deadline=None))
    text = labkit.explain(info.value)
    assert text.startswith("the count must stay below 3")
    assert "shortest sequence of steps" in text
    lines = text.splitlines()
    assert lines.count("  state.inc()") == 3 and "  state.noop()" not in lines  # shrunk to the three increments
    assert "  state.teardown()" not in lines
