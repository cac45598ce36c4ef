"""Notebook 01's quantization error explorer: choose a scheme, see the error it leaves and the
memory it takes (the arithmetic lives in :mod:`inferlab.quant.explore`)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from inferlab.quant.explore import SCHEMES, roundtrip
from inferlab.viz.figures import LOG_AXIS, Live, LiveFigure, style


def error_explorer(w: torch.Tensor, linear_params: int, name: str = "layer", bins: int = 61) -> Live:
    """A scheme to choose; a histogram of w~ - w for ``w`` (log counts) and a bar of the memory
    of all ``linear_params`` linear weights stored that way, beside fp16."""
    import ipywidgets as W

    w = w.detach().float()
    scheme = W.Dropdown(options=list(SCHEMES), value="int4 g128", description="scheme")
    header = W.HTML()

    def state() -> tuple[dict[int, dict], str]:
        """Both traces and the title for the chosen scheme; sets the readout."""
        bits, group = SCHEMES[scheme.value]
        w_hat, bpw = roundtrip(w, bits, group)
        err = ((w_hat - w) / w.std()).flatten()
        lim = max(err.abs().max().item(), 1e-6)
        counts, edges = np.histogram(err.numpy(), bins=bins, range=(-lim, lim))
        mib_fp16, mib = linear_params * 2 / 2**20, linear_params * bpw / 8 / 2**20
        slack = ""
        if isinstance(bits, int) and bits < 4:
            tight = bits + 24 / (w.shape[1] if group == -1 else group)
            slack = (f"; its {bits}-bit codes sit in 4-bit slots, as this engine stores them (packed "
                     f"with no slack: {tight:.2f} bits/weight, {linear_params * tight / 8 / 2**20:.2f} MiB)")
        header.value = (f"<b>{scheme.value}</b> on {name}: {bpw:.2f} bits/weight, "
                        f"{mib:.2f} MiB vs {mib_fp16:.2f} MiB in fp16 ({mib / mib_fp16:.2f}x){slack}; "
                        f"relative RMS error {err.pow(2).mean().sqrt().item():.4f}")
        centers = np.round((edges[:-1] + edges[1:]) / 2, 5).tolist()
        return ({0: dict(x=centers, y=counts.tolist()), 1: dict(x=["fp16", scheme.value], y=[mib_fp16, mib])},
                f"{name}: {scheme.value}")

    traces, title = state()
    fig = make_subplots(rows=1, cols=2, column_widths=[0.72, 0.28],
                        subplot_titles=("error w~ - w (in units of std(w))", "linear weights, MiB"))
    fig.add_bar(name="error", row=1, col=1, **traces[0])  # bin counts, not raw values: a small notebook
    fig.add_bar(name="MiB", row=1, col=2, **traces[1])
    style(fig, title, height=380)
    fig.update_layout(showlegend=False)
    fig.update_yaxes(title_text="weights (count)", row=1, col=1, **LOG_AXIS)
    fig.update_xaxes(title_text="w~ - w, in std(w)", row=1, col=1)
    fig.update_xaxes(type="category", row=1, col=2)
    fig.update_yaxes(title_text="MiB", row=1, col=2)
    plot = LiveFigure(fig)

    def redraw(*_):
        traces, title = state()
        plot.update(traces, {"title.text": title})

    scheme.observe(redraw, names="value")
    live = Live(W.VBox([scheme, header, plot.widget]), plot.figure, header=header,
                description="quantization error explorer")
    live.scheme = scheme
    return live
