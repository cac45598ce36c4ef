"""Tensor parallelism on notebook 00's roofline: the numbers checked by hand against the formula
(weights / N / HBM bandwidth + (2L + 1) x (latency + 2 (N-1)/N x batch x hidden x 2 bytes / link))."""
import pytest

from inferlab import roofline
from inferlab.viz import roofline_plot, tp_plots

H100 = roofline.PRESETS["H100 SXM"]
LINKS = {"nvlink": (900e9, 10e-6), "pcie": (64e9, 25e-6)}


def points():
    return roofline_plot.tp_decode_points(H100, 70e9, 16, 8192, 80, LINKS, degrees=(1, 2, 4, 8))


def test_gang_multiplies_the_roof():
    eight = roofline_plot.gang(H100, 8)
    assert roofline_plot.gang(H100, 1) is H100
    assert (eight.peak_flops, eight.mem_bandwidth, eight.memory_bytes) == (8 * 989e12, 8 * 3.35e12, 8 * 80e9)
    assert eight.ridge_point == pytest.approx(H100.ridge_point)  # N GPUs: the same ridge, a higher roof
    assert eight.name == "8 x H100 SXM"


def test_decode_points_by_hand():
    nv, pc = points().values()
    one, eight = nv[0], nv[-1]
    assert [p["tp"] for p in nv] == [1, 2, 4, 8] and [p["name"] for p in pc] == ["TP=1", "TP=2", "TP=4", "TP=8"]
    assert one["step_s"] == pytest.approx(140e9 / 3.35e12) and one["all_reduces"] == 0
    # TP=8 over NVLink: 17.5 GB per GPU, 161 all-reduces of 8192 x 2 bytes
    weight_s = 140e9 / 8 / 3.35e12
    all_reduce_s = 161 * (10e-6 + 2 * 7 / 8 * 16384 / 900e9)
    assert eight["weight_s"] == pytest.approx(weight_s) and eight["all_reduce_s"] == pytest.approx(all_reduce_s)
    assert eight["step_s"] == pytest.approx(weight_s + all_reduce_s)
    assert pc[-1]["all_reduce_s"] == pytest.approx(161 * (25e-6 + 2 * 7 / 8 * 16384 / 64e9))
    for p in nv + pc:
        assert p["intensity"] == 1.0  # fp16, batch 1: 2 FLOPs per 2-byte parameter, at every degree
        assert p["flops"] == pytest.approx(2 * 70e9 / p["step_s"])  # the step's FLOPs over its time
        # under its own roof by exactly the all-reduces' share of the step
        share = roofline_plot.roof_share(roofline_plot.gang(H100, p["tp"]), p)
        assert share == pytest.approx(1 - p["all_reduce_share"])


def test_decode_points_reuse_notebook_09s_model():
    nv = points()["nvlink"]
    want = tp_plots.decode_step(70e9, 2, 8192, 80, 1, 4, 3.35e12, 900e9, 10e-6)
    assert {k: nv[2][k] for k in want} == want


def test_figure_draws_every_roof_and_each_links_points():
    fig = roofline_plot.tp_roofline_figure(H100, points())
    names = [t.name for t in fig.data]
    assert names == ["roof of H100 SXM", "roof of 2 x H100 SXM", "roof of 4 x H100 SXM", "roof of 8 x H100 SXM",
                     "decode step, nvlink", "decode step, pcie"]
    eight_roof = fig.data[3]
    assert eight_roof.y[0] == pytest.approx(eight_roof.x[0] * 8 * 3.35e12)  # the memory slope of 8 GPUs
    nv = fig.data[4]
    assert list(nv.x) == [1.0] * 4 and list(nv.text) == ["TP=1", "TP=2", "TP=4", "TP=8"]
    assert nv.y[0] == pytest.approx(3.35e12)  # TP=1 on the one-GPU roof at intensity 1
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
