"""The roofline picture and the bytes-per-token calculator of notebook 00.

A roofline plots attainable FLOP/s against arithmetic intensity (FLOPs per byte moved):

    attainable = min(peak_flops, intensity * memory_bandwidth)

Left of the ridge point (peak / bandwidth) the memory system limits you; right of it, the ALUs.
Decoding one token reads every weight to do ~2 FLOPs per parameter, an intensity of
2 / bytes_per_param (1 FLOP/byte in fp16), far left of any GPU's ridge (~200-300 FLOP/byte).

Tensor parallelism over N GPUs raises the roof N-fold (N HBMs read N shards at once) without moving
the point sideways (each GPU does 1/N of the FLOPs on 1/N of the bytes); the all-reduces between
layers add time that holds the point under that roof (``tp_decode_points``, ``tp_roofline_figure``).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from inferlab import roofline
from inferlab.viz import tp_plots
from inferlab.viz.figures import Live, LiveFigure, style
from inferlab.viz.numbers import count, number, percent, si

PRECISIONS = {"fp32": 32, "fp16 / bf16": 16, "int8": 8, "int4": 4}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
_X_RANGE = (0.05, 20000.0)  # FLOP/byte shown on the x axis
ABOVE_ROOF_TOLERANCE = 1.02  # a measured point this far above its roof is flagged, never drawn silently


def _roof_xy(hw: roofline.Hardware):
    lo, hi = _X_RANGE
    xs = [lo, hw.ridge_point, hi] if lo < hw.ridge_point < hi else [lo, hi]
    return xs, [hw.attainable_flops(x) for x in xs]


def attainable_flops(hw: roofline.Hardware, intensity: float) -> float:
    return hw.attainable_flops(intensity)


def roof_share(hw: roofline.Hardware, point: dict) -> float:
    """A measured point's FLOP/s as a fraction of the roof at its intensity (above 1: above the roof)."""
    return point["flops"] / hw.attainable_flops(point["intensity"])


def above_roof(hw: roofline.Hardware, points: list[dict]) -> list[dict]:
    """The points drawn above ``hw``'s roof. The roof is an upper bound, so such a point means the
    roof was measured too low (the machine was busier when it was measured), not a faster model."""
    return [p for p in points if roof_share(hw, p) > ABOVE_ROOF_TOLERANCE]


def _label(hw: roofline.Hardware, point: dict) -> str:
    share = roof_share(hw, point)
    if share > ABOVE_ROOF_TOLERANCE:
        return f"{point['name']}: {percent(share)} of the roof (above it: the roof was measured low)"
    return point["name"]


def roofline_figure(hw: roofline.Hardware, points: list[dict] | None = None, title: str | None = None,
                    height: int = 440) -> go.Figure:
    """A log-log roofline for ``hw``; ``points`` = [{"name", "intensity", "flops"}] are marked on it.

    A point above the roof is labelled as such (with its share of the roof), never drawn silently.
    """
    fig = go.Figure()
    xs, ys = _roof_xy(hw)
    fig.add_scatter(x=xs, y=ys, mode="lines", name=f"{hw.name} roofline", line=dict(width=3))
    for p in points or []:
        fig.add_scatter(x=[p["intensity"]], y=[p["flops"]], mode="markers+text", name=_label(hw, p),
                        text=[p["name"]], textposition="top center", marker=dict(size=12))
    fig.update_layout(xaxis=dict(title="arithmetic intensity (FLOP / byte)", range=np.log10(_X_RANGE).tolist()),
                      yaxis=dict(title="attainable FLOP/s"), legend=dict(orientation="h", y=-0.25))
    return style(fig, title or f"Roofline: {hw.name}", height=height, log_x=True, log_y=True)


def _readout(hw, params, bits, batch, points=()) -> tuple[str, dict]:
    r = roofline.decode_tokens_per_s(hw, params, bits, batch)
    nbytes = roofline.weight_bytes(params, bits)
    fits = nbytes <= hw.memory_bytes if hw.memory_bytes else True
    text = (f"<b>{count(params)} parameters at {bits} bits</b>: {si(nbytes, 'B')} of weights read per decode step"
            f"{'' if fits else ' <i>(does not fit in this device memory)</i>'}.<br>"
            f"Decode ceiling on <b>{hw.name}</b>: <b>{number(r['tokens_per_s'])} tokens/s</b> for a batch of "
            f"{batch} ({number(r['tokens_per_s'] / batch)} per sequence), {r['bound']}-bound; "
            f"intensity {number(roofline.arithmetic_intensity(params, bits, batch))} FLOP/byte vs ridge "
            f"{number(hw.ridge_point)}.")
    high = above_roof(hw, list(points))
    if high:
        text += ("<br><i>Above the roof: " + ", ".join(p["name"] for p in high) + ". The roof is an upper "
                 "bound, so it was measured low (the machine was busier then); measure it again.</i>")
    return text, r


def roofline_calculator(hardware: dict[str, roofline.Hardware] | None = None, params_b: float = 70.0,
                        bits: int = 16, batch: int = 1, prompt_tokens: int = 512, start: str = "H100 SXM",
                        measured: dict[str, list[dict]] | None = None) -> Live:
    """Sliders for hardware, model size, precision and batch; a roofline and the tokens/s ceiling.

    The figure marks two points for the chosen model: one decode step (``batch`` tokens share one
    read of the weights) and a prefill of ``prompt_tokens`` tokens (they all share one read).
    ``measured`` adds points per hardware name (e.g. this machine's measured runs); the returned
    ``Live`` has ``.place(hardware_name, points)`` to add them after the fact.
    """
    import ipywidgets as W

    hardware = dict(hardware or roofline.PRESETS)
    measured = measured or {}
    hw_box = W.Dropdown(options=list(hardware), value=start if start in hardware else next(iter(hardware)),
                        description="hardware")
    size = W.FloatLogSlider(value=params_b, base=10, min=-1, max=3, step=0.05, description="params (B)",
                            readout_format=".3g", continuous_update=False)
    prec = W.SelectionSlider(options=[(k, v) for k, v in PRECISIONS.items()], value=bits, description="precision",
                             continuous_update=False)
    bat = W.SelectionSlider(options=BATCHES, value=batch, description="batch", continuous_update=False)
    header = W.HTML()

    def state() -> tuple[dict[int, dict], str]:
        """Every trace's data and the title for the controls' current values."""
        hw, params, b = hardware[hw_box.value], size.value * 1e9, bat.value
        text, r = _readout(hw, params, prec.value, b, measured.get(hw_box.value, []))
        header.value = text
        ai_dec = roofline.arithmetic_intensity(params, prec.value, b)
        ai_pre = roofline.arithmetic_intensity(params, prec.value, prompt_tokens)
        xs, ys = _roof_xy(hw)
        pts = measured.get(hw_box.value, [])
        traces = {
            0: dict(x=xs, y=ys, name=f"{hw.name} roofline"),
            1: dict(x=[ai_dec], y=[hw.attainable_flops(ai_dec)], text=[f"decode: {number(r['tokens_per_s'])} tok/s"]),
            2: dict(x=[ai_pre], y=[hw.attainable_flops(ai_pre)], text=["prefill"]),
            3: dict(x=[p["intensity"] for p in pts], y=[p["flops"] for p in pts], text=[_label(hw, p) for p in pts]),
        }
        title = f"Roofline: {hw.name}, {count(params)} params, {prec.label}, batch {b}"
        return traces, title

    # The figure starts from the real values (no placeholder for a later update to replace).
    traces, title = state()
    base = roofline_figure(hardware[hw_box.value], title=title)
    base.data[0].update(traces[0])
    base.add_scatter(mode="markers+text", name="decode step", textposition="bottom right",
                     marker=dict(size=14, symbol="circle"), **traces[1])
    base.add_scatter(mode="markers+text", name=f"prefill ({prompt_tokens} tokens)", textposition="top left",
                     marker=dict(size=14, symbol="diamond"), **traces[2])
    base.add_scatter(mode="markers+text", name="measured", textposition="top center",
                     marker=dict(size=12, symbol="x"), **traces[3])
    plot = LiveFigure(base)

    def redraw(*_):
        traces, title = state()
        plot.update(traces, {"title.text": title})

    for w in (hw_box, size, prec, bat):
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox([hw_box, prec]), W.HBox([size, bat]), header, plot.widget])
    box.add_class("inferlab-roofline-calculator")
    live = Live(box, plot.figure, header=header, description="roofline calculator")

    def place(hardware_name: str, points: list[dict]) -> None:
        """Mark measured points ({"name", "intensity", "flops"}) on ``hardware_name``'s roofline."""
        measured[hardware_name] = list(points)
        redraw()

    live.place = place
    return live


def gang(hw: roofline.Hardware, n: int) -> roofline.Hardware:
    """``n`` devices of ``hw`` working as one: n times its FLOP/s, bandwidth and memory."""
    return hw if n == 1 else roofline.Hardware(f"{n} x {hw.name}", n * hw.peak_flops, n * hw.mem_bandwidth,
                                               n * hw.memory_bytes)


def tp_decode_points(hw: roofline.Hardware, params: float, bits: int, hidden: int, layers: int,
                     links: dict[str, tuple[float, float]], degrees=(1, 2, 4, 8), batch: int = 1) -> dict[str, list[dict]]:
    """Each link's decode step at each TP degree (``tp_plots.decode_step``: the shard read from HBM
    plus 2L + 1 all-reduces), as roofline points of ``gang(hw, tp)``: the intensity of the unsplit
    step, and the FLOP/s the ``tp`` GPUs achieve together (the step's FLOPs over its time).
    ``links``: name -> (bytes/s per GPU, latency of one small all-reduce), as ``tp_plots.LINKS``."""
    out = {}
    for link, (link_bw, latency) in links.items():
        out[link] = [{**tp_plots.decode_step(params, bits / 8, hidden, layers, batch, n, hw.mem_bandwidth, link_bw,
                                             latency),
                      "tp": n, "name": f"TP={n}", "intensity": roofline.arithmetic_intensity(params, bits, batch)}
                     for n in degrees]
        for p in out[link]:
            p["flops"] = roofline.decode_step_flops(params, batch) / p["step_s"]
    return out


def tp_roofline_figure(hw: roofline.Hardware, points: dict[str, list[dict]], title: str | None = None,
                       height: int = 440) -> go.Figure:
    """The roofs of 1, 2, 4... x ``hw`` and each link's decode points (``tp_decode_points``) under them."""
    fig = go.Figure()
    degrees = [p["tp"] for p in next(iter(points.values()))]
    for n in degrees:
        xs, ys = _roof_xy(gang(hw, n))
        fig.add_scatter(x=xs, y=ys, mode="lines", name=f"roof of {gang(hw, n).name}", line=dict(width=2))
    for (link, pts), side, symbol in zip(points.items(), ("middle right", "middle left"), ("circle", "square")):
        fig.add_scatter(x=[p["intensity"] for p in pts], y=[p["flops"] for p in pts], mode="markers+text",
                        name=f"decode step, {link}", text=[p["name"] for p in pts], textposition=side,
                        marker=dict(size=11, symbol=symbol))
    fig.update_layout(xaxis=dict(title="arithmetic intensity (FLOP / byte)", range=[-1, 3.5]),
                      yaxis=dict(title="attainable FLOP/s (all GPUs together)"), legend=dict(orientation="h", y=-0.25))
    return style(fig, title or f"Tensor parallelism on the roofline: {hw.name}", height=height, log_x=True, log_y=True)
