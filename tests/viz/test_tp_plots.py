"""Notebook 09's calculator: the formula on numbers a reader can check by hand, and a live widget
whose every control moves the plotted data."""
from __future__ import annotations

import pytest

from inferlab.viz import tp_plots


def test_seventy_billion_in_fp16_needs_two_h100s():
    r = tp_plots.decode_step(70e9, 2, 8192, 80, 1, 1, 3.35e12, 900e9, 10e-6)
    assert r["weight_bytes"] == 140e9 and r["all_reduces"] == 0
    assert r["step_s"] == pytest.approx(140e9 / 3.35e12)  # the roofline: bytes / bandwidth
    assert tp_plots.tp_needed(140e9, 80e9) == 2 and tp_plots.tp_needed(140e9, 141e9) == 2  # 90% of 141 GB is 127 GB
    assert tp_plots.tp_needed(120e9, 141e9) == 1
    assert tp_plots.tp_needed(810e9, 80e9) == 16 and tp_plots.tp_needed(2e12, 24e9) is None


def test_ring_all_reduce_terms():
    """TP=4, batch 8, hidden 8192: 161 all-reduces of 8 x 8192 x 2 bytes, each 2(N-1)/N of it over the link."""
    r = tp_plots.decode_step(70e9, 2, 8192, 80, 8, 4, 3.35e12, 64e9, 25e-6)
    message = 8 * 8192 * 2
    assert r["bytes_per_all_reduce"] == message and r["all_reduces"] == 161
    assert r["all_reduce_s"] == pytest.approx(161 * (25e-6 + 1.5 * message / 64e9))
    assert r["weight_s"] == pytest.approx(35e9 / 3.35e12)
    assert r["all_reduce_share"] == pytest.approx(r["all_reduce_s"] / (r["all_reduce_s"] + r["weight_s"]))


def test_every_control_changes_the_plot():
    live = tp_plots.tp_calculator()
    controls = [w for row in live.widget.children[:2] for w in row.children] + [live.widget.children[2]]
    for control in controls:
        before = [list(t.y) for t in live.figure.data]
        options = list(control.options)
        control.value = options[-1] if control.value != options[-1] else options[0]
        assert [list(t.y) for t in live.figure.data] != before, control.description
