"""The teaching helpers notebook 03 uses: the online-softmax trace, its stepper, the split view
and the traffic count."""
import math

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
    slider.value = 3
    assert "tile 3: keys 8..11" in live.header.value
    assert float(live.header.value.rsplit("= ", 1)[1]) < 1e-5  # exact after the last tile
    assert float(first.rsplit("= ", 1)[1]) > 1e-3  # not after the first
    assert sum(live.figure.data[2].y) > 0.999  # the weights of every key, summing to one
    assert "text/html" in live._repr_mimebundle_()
