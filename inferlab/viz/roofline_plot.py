"""The roofline picture and the bytes-per-token calculator of notebook 00.

A roofline plots attainable FLOP/s against arithmetic intensity (FLOPs per byte moved):

    attainable = min(peak_flops, intensity * memory_bandwidth)

Left of the ridge point (peak / bandwidth) the memory system limits you; right of it, the ALUs.
Decoding one token reads every weight to do ~2 FLOPs per parameter, an intensity of
2 / bytes_per_param (1 FLOP/byte in fp16), far left of any GPU's ridge (~200-300 FLOP/byte).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from inferlab import roofline
from inferlab.viz.figures import Live

PRECISIONS = {"fp32": 32, "fp16 / bf16": 16, "int8": 8, "int4": 4}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
_X_RANGE = (0.05, 20000.0)  # FLOP/byte shown on the x axis


def _roof_xy(hw: roofline.Hardware):
    lo, hi = _X_RANGE
    xs = [lo, hw.ridge_point, hi] if lo < hw.ridge_point < hi else [lo, hi]
    return xs, [hw.attainable_flops(x) for x in xs]


def attainable_flops(hw: roofline.Hardware, intensity: float) -> float:
    return hw.attainable_flops(intensity)


def roofline_figure(hw: roofline.Hardware, points: list[dict] | None = None, title: str | None = None,
                    height: int = 420) -> go.Figure:
    """A log-log roofline for ``hw``; ``points`` = [{"name", "intensity", "flops"}] are marked on it."""
    fig = go.Figure()
    xs, ys = _roof_xy(hw)
    fig.add_scatter(x=xs, y=ys, mode="lines", name=f"{hw.name} roofline", line=dict(width=3))
    for p in points or []:
        fig.add_scatter(x=[p["intensity"]], y=[p["flops"]], mode="markers+text", name=p["name"],
                        text=[p["name"]], textposition="top center", marker=dict(size=12))
    fig.update_layout(
        title=title or f"Roofline: {hw.name}", height=height, margin=dict(l=60, r=20, t=50, b=50),
        xaxis=dict(type="log", title="arithmetic intensity (FLOP / byte)", range=np.log10(_X_RANGE).tolist()),
        yaxis=dict(type="log", title="attainable FLOP/s"), legend=dict(orientation="h", y=-0.25),
    )
    return fig


def _readout(hw, params, bits, batch) -> tuple[str, dict]:
    r = roofline.decode_tokens_per_s(hw, params, bits, batch)
    gb = roofline.weight_bytes(params, bits) / 1e9
    fits = roofline.weight_bytes(params, bits) <= hw.memory_bytes if hw.memory_bytes else True
    text = (f"<b>{params / 1e9:g}B parameters at {bits} bits</b>: {gb:,.1f} GB of weights read per decode step"
            f"{'' if fits else ' <i>(does not fit in this device memory)</i>'}.<br>"
            f"Decode ceiling on <b>{hw.name}</b>: <b>{r['tokens_per_s']:,.1f} tokens/s</b> for a batch of "
            f"{batch} ({r['tokens_per_s'] / batch:,.1f} per sequence), {r['bound']}-bound; "
            f"intensity {roofline.arithmetic_intensity(params, bits, batch):,.2f} FLOP/byte vs ridge "
            f"{hw.ridge_point:,.0f}.")
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
    fig = go.FigureWidget(roofline_figure(hardware[hw_box.value]))
    fig.add_scatter(x=[1], y=[1], mode="markers+text", name="decode step", textposition="bottom right",
                    marker=dict(size=14, symbol="circle"))
    fig.add_scatter(x=[1], y=[1], mode="markers+text", name=f"prefill ({prompt_tokens} tokens)",
                    textposition="top left", marker=dict(size=14, symbol="diamond"))
    fig.add_scatter(x=[], y=[], mode="markers+text", name="measured", textposition="top center",
                    marker=dict(size=12, symbol="x"))

    def redraw(*_):
        hw, params, b = hardware[hw_box.value], size.value * 1e9, bat.value
        text, r = _readout(hw, params, prec.value, b)
        header.value = text
        ai_dec = roofline.arithmetic_intensity(params, prec.value, b)
        ai_pre = roofline.arithmetic_intensity(params, prec.value, prompt_tokens)
        xs, ys = _roof_xy(hw)
        pts = measured.get(hw_box.value, [])
        with fig.batch_update():
            fig.data[0].update(x=xs, y=ys, name=f"{hw.name} roofline")
            fig.data[1].update(x=[ai_dec], y=[attainable_flops(hw, ai_dec)],
                               text=[f"decode: {r['tokens_per_s']:,.1f} tok/s"])
            fig.data[2].update(x=[ai_pre], y=[attainable_flops(hw, ai_pre)], text=["prefill"])
            fig.data[3].update(x=[p["intensity"] for p in pts], y=[p["flops"] for p in pts],
                               text=[p["name"] for p in pts])
            fig.layout.title.text = f"Roofline: {hw.name}, {size.value:.3g}B params, {prec.label}, batch {b}"

    for w in (hw_box, size, prec, bat):
        w.observe(redraw, names="value")
    redraw()
    box = W.VBox([W.HBox([hw_box, prec]), W.HBox([size, bat]), header, fig])
    box.add_class("inferlab-roofline-calculator")
    live = Live(box, fig, header=header, description="roofline calculator")

    def place(hardware_name: str, points: list[dict]) -> None:
        """Mark measured points ({"name", "intensity", "flops"}) on ``hardware_name``'s roofline."""
        measured[hardware_name] = list(points)
        redraw()

    live.place = place
    return live
