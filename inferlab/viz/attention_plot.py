"""The online-softmax stepper of notebook 03: one query, its keys in tiles, one tile per step.

A slider picks how many tiles the kernel has seen. The top plot shows every score (the tiles
seen in colour, the newest one highlighted) and the running maximum ``m``; the bottom plot shows
the attention weights as the kernel knows them at that point, exp(s - m) / l, against the exact
softmax. The readout gives m, l, the rescale factor alpha = exp(m_old - m_new) and how far the
output so far is from the exact one.
"""
from __future__ import annotations

import torch
from plotly.subplots import make_subplots

from inferlab.viz.figures import Live, LiveFigure, style


def online_softmax_stepper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int = 4,
                           start: int = 1) -> Live:
    """Live view of :func:`inferlab.kernels.flash_attention.online_softmax_trace` for q [D], k/v [T, D]."""
    import ipywidgets as W

    from inferlab.kernels.flash_attention import online_softmax_trace

    steps = online_softmax_trace(q, k, v, block_n)
    scores = torch.cat([s["scores"] for s in steps])
    exact_p = scores.softmax(0)
    exact_out = exact_p @ v.float()
    keys = list(range(len(scores)))
    slider = W.IntSlider(value=start, min=1, max=len(steps), description="tiles seen", continuous_update=False)
    header = W.HTML()

    def state() -> tuple[dict[int, dict], str]:
        """Every changing trace's data and the title after ``slider.value`` tiles; sets the readout."""
        i = slider.value - 1
        st = steps[i]
        seen = st["stop"]
        colors = ["#d62728" if st["start"] <= j < seen else ("#1f77b4" if j < seen else "#d9d9d9") for j in keys]
        weights = [float(torch.exp(scores[j] - st["m"]) / st["l"]) if j < seen else 0.0 for j in keys]
        err = (st["out"] - exact_out).abs().max().item()
        header.value = (f"tile {i + 1}: keys {st['start']}..{seen - 1} &nbsp; m = {st['m']:.3f} &nbsp; "
                        f"l = {st['l']:.4f} &nbsp; alpha = exp(m_old - m_new) = {st['alpha']:.4f} &nbsp; "
                        f"max |out - exact| = {err:.2e}")
        traces = {0: dict(marker=dict(color=colors)), 1: dict(x=[-0.5, seen - 0.5], y=[st["m"], st["m"]]),
                  2: dict(y=weights)}
        return traces, f"after tile {i + 1} of {len(steps)}: keys 0..{seen - 1} seen"

    # The figure starts from the slider's real value (no placeholder for a later update to replace).
    traces, title = state()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("scores s = q·k / sqrt(D), tile by tile",
                                        "attention weights: exp(s - m) / l so far vs exact softmax"))
    fig.add_bar(x=keys, y=scores.tolist(), name="score", row=1, col=1, **traces[0])
    fig.add_scatter(mode="lines", name="running max m", line=dict(dash="dash"), row=1, col=1, **traces[1])
    fig.add_bar(x=keys, name="weight so far", row=2, col=1, **traces[2])
    fig.add_scatter(x=keys, y=exact_p.tolist(), mode="markers", name="exact softmax", marker=dict(symbol="x"),
                    row=2, col=1)
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text="key position", row=2, col=1)
    style(fig, title, height=560)
    fig.update_layout(margin=dict(t=92))  # room for the top subplot's title under the figure's
    plot = LiveFigure(fig)

    def redraw(*_):
        traces, title = state()
        plot.update(traces, {"title.text": title})

    slider.observe(redraw, names="value")
    return Live(W.VBox([slider, header, plot.widget]), plot.figure, header=header,
                description="online softmax stepper")
