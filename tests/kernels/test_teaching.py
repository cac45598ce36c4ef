"""The teaching helpers notebook 03 uses: the online-softmax trace, its stepper, the split view
and the traffic count."""
import math

import pytest
import torch

from inferlab.kernels.flash_attention import hbm_bytes, online_softmax_attention, online_softmax_trace
from inferlab.kernels.flash_decoding import split_partials


def test_trace_ends_at_the_exact_softmax_and_rescales_when_the_max_grows():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(8, generator=g) * 3, torch.randn(30, 8, generator=g) * 3, torch.randn(30, 8, generator=g)
    trace = online_softmax_trace(q, k, v, block_n=7)
    exact = torch.softmax(k @ q / math.sqrt(8), 0) @ v
    assert [s["start"] for s in trace] == [0, 7, 14, 21, 28] and trace[-1]["stop"] == 30
    torch.testing.assert_close(trace[-1]["out"], exact)
    for before, after in zip(trace, trace[1:]):
        assert after["m"] >= before["m"]
        assert math.isclose(after["alpha"], math.exp(before["m"] - after["m"]), rel_tol=1e-6)
    torch.testing.assert_close(online_softmax_attention(q, k, v, 4), exact)


def test_split_partials_merge_to_the_exact_output():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(16, generator=g), torch.randn(45, 16, generator=g), torch.randn(45, 16, generator=g)
    view = split_partials(q, k, v, num_splits=4)
    assert [p["start"] for p in view["splits"]] == [0, 12, 24, 36]
    assert math.isclose(sum(p["weight"] for p in view["splits"]), 1.0, rel_tol=1e-6)
    torch.testing.assert_close(view["out"], torch.softmax(k @ q / 4, 0) @ v)


def test_traffic_count():
    r = hbm_bytes(8192, head_dim=64, heads=1, dtype_bytes=2, block_m=128)
    assert r["naive"] == (4 * 8192 * 64 + 4 * 8192**2) * 2
    assert r["tiled"] == (2 * 8192 * 64 + 2 * 8192 * 64 * 64) * 2
    assert r["scores"] == 8192**2 * 2


def test_stepper_redraws_on_the_slider():
    from inferlab.viz.attention_plot import online_softmax_stepper

    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(8, generator=g), torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
    live = online_softmax_stepper(q, k, v, block_n=4, start=1)
    slider = live.widget.children[0]
    first = live.header.value
    assert "tile 1: keys 0..3" in first

    def sent():  # the figure as the browser receives it (the LiveFigure's Output widget)
        (output,) = live.widget.children[-1].outputs
        return output["data"]["application/vnd.plotly.v1+json"]

    scores, m_line, weights, exact = sent()["data"]  # the first view, before the slider moves
    assert m_line["x"] == [-0.5, 3.5] and len(set(m_line["y"])) == 1
    assert m_line["y"][0] == pytest.approx(max(scores["y"][:4]), abs=1e-6)  # m after one tile: the max of 4 scores
    assert weights["y"][4:] == [0.0] * 8 and sum(weights["y"]) == pytest.approx(1.0, abs=1e-5)
    assert scores["marker"]["color"].count("#d9d9d9") == 8 and "after tile 1 of 3" in sent()["layout"]["title"]["text"]
    slider.value = 3
    assert "tile 3: keys 8..11" in live.header.value
    assert float(live.header.value.rsplit("= ", 1)[1]) < 1e-5  # exact after the last tile
    assert float(first.rsplit("= ", 1)[1]) > 1e-3  # not after the first
    scores, m_line, weights, exact = sent()["data"]
    assert m_line["x"] == [-0.5, 11.5] and m_line["y"][0] == pytest.approx(max(scores["y"]), abs=1e-6)
    assert weights["y"] == pytest.approx(exact["y"], abs=1e-5)  # every key seen: the exact softmax
    assert "#d9d9d9" not in scores["marker"]["color"] and "after tile 3 of 3" in sent()["layout"]["title"]["text"]
    assert "text/html" in live._repr_mimebundle_()
