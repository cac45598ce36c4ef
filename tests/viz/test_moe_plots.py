"""Notebook 06's live figures send whole figures holding the real data, first view and after a change."""
from __future__ import annotations

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

import plotly.graph_objects as go  # noqa: E402

from inferlab import roofline  # noqa: E402

from inferlab.model import moe
from inferlab.model.loader import ASSETS, load_checkpoint  # noqa: E402
from inferlab.viz import moe_plots  # noqa: E402


def _sent_figure(live):
    """The figure as the browser receives it: the plotly JSON in the LiveFigure's Output widget."""
    (output,) = live.widget.children[-1].outputs
    return output["data"]["application/vnd.plotly.v1+json"]


def _expected_ceilings(spec, hw, batch):
    """The three models' decode ceilings (tokens/s) at ``batch``, computed here from the spec by hand."""
    total = spec["shared"] + spec["num_experts"] * spec["per_expert"]
    active = spec["shared"] + spec["top_k"] * spec["per_expert"]
    touched = spec["num_experts"] * (1 - (1 - spec["top_k"] / spec["num_experts"]) ** batch)
    moe_bytes = 2 * (spec["shared"] + touched * spec["per_expert"])
    steps = [(2 * total * batch, 2 * total), (2 * active * batch, moe_bytes), (2 * active * batch, 2 * active)]
    return [batch / max(b / hw.mem_bandwidth, f / hw.peak_flops) for f, b in steps]


def test_moe_roofline_sends_its_points_from_the_first_view():
    spec, hw = moe_plots.MIXTRAL_8X7B, roofline.PRESETS["H100 SXM"]
    live = moe_plots.moe_roofline(spec, hw="H100 SXM", batch=1)
    assert not any(isinstance(w, go.FigureWidget) for w in live.widget.children)
    names = ["dense 46.7B", "Mixtral-8x7B (MoE)", "dense 12.9B"]
    for batch in (1, 8, 64):
        if batch != 1:
            live.widget.children[0].value = batch
        sent = _sent_figure(live)
        assert [t["name"] for t in sent["data"][:3]] == names
        for curve, point, expected in zip(sent["data"][:3], sent["data"][3:], _expected_ceilings(spec, hw, batch)):
            assert point["x"] == [batch] and point["y"] == [pytest.approx(expected, rel=1e-9)]
            assert curve["y"][curve["x"].index(batch)] == pytest.approx(expected, rel=1e-9)
        assert f"batch {batch}:" in live.header.value
    ceilings = {b: _expected_ceilings(spec, hw, b) for b in (1, 64)}
    assert ceilings[1][1] == pytest.approx(ceilings[1][2])  # batch 1: the MoE reads what the small model reads
    assert ceilings[64][1] == pytest.approx(ceilings[64][0], rel=1e-6)  # batch 64: what the large one reads
    assert "text/html" in live._repr_mimebundle_()


@pytest.mark.skipif(not (ASSETS / "moe" / "model.safetensors").exists(), reason="notebook 06's MoE model is not built")
def test_routing_view_sends_the_routing_of_the_chosen_snippet_and_layer():
    model, tok = load_checkpoint("moe", device="cpu")
    snippets = {"add": "def add(a, b):\n    return a + b\n", "loop": "for i in range(10):\n    print(i)\n"}
    live = moe_plots.routing_view(model, tok, snippets, layer=0)
    controls = live.widget.children[0].children

    def check(name, layer):
        sent = _sent_figure(live)
        (heat,) = sent["data"]
        r = moe_plots.route_text(model, tok, snippets[name])
        weights = r["layers"][layer]
        assert len(heat["x"]) == len(tok.encode(snippets[name])) == weights.shape[0]
        assert heat["y"] == list(range(model.config.num_local_experts))
        top_k = moe.moe_blocks(model)[layer].top_k
        for t in range(len(heat["x"])):  # each token's column: top_k experts, weights summing to one
            column = [row[t] for row in heat["z"]]
            chosen = [v for v in column if v is not None]
            assert len(chosen) == top_k and sum(chosen) == pytest.approx(1.0, abs=1e-5)
            assert [e for e, v in enumerate(column) if v is not None] == (weights[t] > 0).nonzero().flatten().tolist()
        assert sent["layout"]["title"]["text"].startswith(f"layer {layer}:") and repr(name) in sent["layout"]["title"]["text"]

    check("add", 0)
    controls[0].value = "loop"
    check("loop", 0)
    controls[1].value = controls[1].max
    check("loop", controls[1].max)
