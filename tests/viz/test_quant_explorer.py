"""Notebook 01's error explorer: a LiveFigure (no FigureWidget) whose every scheme sends a whole
figure, labelled bars included, and whose readout says why int3/int2 take int4's memory."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

import plotly.graph_objects as go  # noqa: E402
import torch  # noqa: E402

from inferlab.quant.explore import SCHEMES, roundtrip  # noqa: E402
from inferlab.viz import quant_explorer  # noqa: E402


def _sent(live):
    (output,) = live.widget.children[-1].outputs
    return output["data"]["application/vnd.plotly.v1+json"]


def test_every_scheme_sends_labelled_bars_and_its_real_error():
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(0))
    live = quant_explorer.error_explorer(w, 10**6, name="w")
    assert not any(isinstance(c, go.FigureWidget) for c in live.widget.children)
    for scheme in SCHEMES:
        live.scheme.value = scheme
        hist, memory = _sent(live)["data"]
        assert memory["x"] == ["fp16", scheme]  # the bars carry their labels
        bits, group = SCHEMES[scheme]
        bpw = roundtrip(w.float(), bits, group)[1]
        assert memory["y"][1] == pytest.approx(10**6 * bpw / 8 / 2**20) and memory["y"][0] == pytest.approx(2 / 2**20 * 10**6)
        assert sum(hist["y"]) == w.numel() and all(math.isfinite(x) for x in hist["x"])
        assert f"{bpw:.2f} bits/weight" in live.header.value
        assert ("4-bit slots" in live.header.value) == (isinstance(bits, int) and bits < 4)
    layout = _sent(live)["layout"]
    assert layout["yaxis"]["type"] == "log" and layout["yaxis"]["title"]["text"] == "weights (count)"
