"""Notebook 01's live views: a weight-error explorer and a Q4_K super-block, byte by byte."""
from __future__ import annotations

import numpy as np
import torch

from inferlab.quant import ggml
from inferlab.quant.int4 import dequantize_int4, quantize_int4
from inferlab.quant.int8 import quantize_int8
from inferlab.quant.nf4 import dequantize_nf4, quantize_nf4

SCHEMES = {"int8 per-channel": (8, None), "int4 g32": (4, 32), "int4 g64": (4, 64), "int4 g128": (4, 128),
           "int4 per-row": (4, -1), "int3 g128": (3, 128), "int2 g64": (2, 64), "nf4 (block 64)": ("nf4", 64)}


def roundtrip(w: torch.Tensor, bits, group: int | None) -> tuple[torch.Tensor, float]:
    """Quantize and dequantize ``w`` with one scheme; returns (w~, bits per weight as stored)."""
    out, cols = w.shape
    if bits == 8:
        q, s = quantize_int8(w)
        return q.float() * s.float()[:, None], 8 + 16 / cols
    if bits == "nf4":
        packed, absmax = quantize_nf4(w, group)
        return dequantize_nf4(packed, absmax, w.shape, group), 4 + 32 / group
    group = cols if group == -1 else group
    qw, s, z = quantize_int4(w, group, bits)
    return dequantize_int4(qw, s, z, group), 4 + 24 / group  # 4-bit slots + fp16 scale + uint8 zero per group


def error_explorer(w: torch.Tensor, linear_params: int, name: str = "layer", bins: int = 61):
    """Choose a bit width and a group size: a histogram of w~ - w for ``w`` and the memory bar
    of all ``linear_params`` linear weights stored that way, against fp16."""
    import ipywidgets as W
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from inferlab.viz import Live

    w = w.detach().float()
    scheme = W.Dropdown(options=list(SCHEMES), value="int4 g128", description="scheme")
    header = W.HTML()
    fig = go.FigureWidget(make_subplots(rows=1, cols=2, column_widths=[0.72, 0.28],
                                        subplot_titles=("error w~ - w (in units of std(w))", "linear weights, MiB")))
    fig.add_bar(x=[], y=[], name="error", row=1, col=1)  # bin counts, not raw values: a small notebook
    fig.add_bar(x=["fp16", "chosen"], y=[0, 0], name="MiB", row=1, col=2)
    fig.update_layout(height=360, showlegend=False, margin=dict(t=60, b=40, l=40, r=20))
    fig.update_yaxes(type="log", row=1, col=1)

    def redraw(*_):
        bits, group = SCHEMES[scheme.value]
        w_hat, bpw = roundtrip(w, bits, group)
        err = ((w_hat - w) / w.std()).flatten()
        lim = max(err.abs().max().item(), 1e-6)
        counts, edges = np.histogram(err.numpy(), bins=bins, range=(-lim, lim))
        mib_fp16, mib = linear_params * 2 / 2**20, linear_params * bpw / 8 / 2**20
        header.value = (f"<b>{scheme.value}</b> on {name}: {bpw:.2f} bits/weight, "
                        f"{mib:.2f} MiB vs {mib_fp16:.2f} MiB in fp16 ({mib / mib_fp16:.2f}x); "
                        f"relative RMS error {err.pow(2).mean().sqrt().item():.4f}")
        with fig.batch_update():
            fig.data[0].x, fig.data[0].y = np.round((edges[:-1] + edges[1:]) / 2, 5), counts
            fig.data[1].y = [mib_fp16, mib]
            fig.layout.title.text = f"{name}: {scheme.value}"

    scheme.observe(redraw, names="value")
    redraw()
    live = Live(W.VBox([scheme, header, fig]), fig, header=header, description="quantization error explorer")
    live.scheme = scheme
    return live


def describe_q4_k(block: torch.Tensor) -> str:
    """What one Q4_K super-block's 144 bytes hold, as text."""
    assert block.numel() == 144, "one super-block is 144 bytes"
    b = block.to(torch.uint8)
    d, dmin = ggml._f16(b[0:2][None]).item(), ggml._f16(b[2:4][None]).item()
    sc, mn = ggml.q4_k_scales_mins(b[4:16][None])
    hexs = lambda t: " ".join(f"{v:02x}" for v in t.tolist())  # noqa: E731
    lines = [f"bytes   0-1   d    (fp16) = {d:.6g}      [{hexs(b[0:2])}]",
             f"bytes   2-3   dmin (fp16) = {dmin:.6g}      [{hexs(b[2:4])}]",
             f"bytes   4-15  8 six-bit scales and 8 six-bit mins, packed   [{hexs(b[4:16])}]"]
    for j in range(8):
        lines.append(f"              sub-block {j}: scale {int(sc[0, j]):2d} x d = {d * int(sc[0, j]):.5f}   "
                     f"min {int(mn[0, j]):2d} x dmin = {dmin * int(mn[0, j]):.5f}")
    lines.append("bytes  16-143 256 four-bit codes: 32 bytes per pair of sub-blocks (low nibbles: the even one)")
    lines.append(f"              first 8 bytes: [{hexs(b[16:24])}]")
    lines.append("value = d*scale_j * q - dmin*min_j   ->   144 bytes * 8 / 256 values = 4.5 bits per weight")
    return "\n".join(lines)
