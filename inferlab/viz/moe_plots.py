"""Notebook 06's figures: which experts each token chose, load per expert, and MoE on the roofline."""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from inferlab import moe, roofline
from inferlab.viz.figures import Live, escape
from inferlab.viz.roofline_plot import _roof_xy, roofline_figure

# Mixtral-8x7B (Jiang et al. 2024): 32 layers of 8 experts (3 x 4096 x 14336 each), top-2
MIXTRAL_8X7B = {"name": "Mixtral-8x7B", "shared": 1.60e9, "per_expert": 32 * 3 * 4096 * 14336,
                "num_experts": 8, "top_k": 2}


@torch.no_grad()
def route_text(model, tokenizer, text: str) -> dict:
    """Run ``text`` through ``model`` and return its tokens and, per MoE layer, the routing
    weights [T, E] (0 where an expert was not chosen)."""
    ids = tokenizer.encode(text)
    model(torch.tensor([ids], device=model.device))
    layers = []
    for block in moe.moe_blocks(model):
        w, idx = moe.route(block.router_logits, block.top_k)
        layers.append(torch.zeros(len(ids), block.num_experts).scatter_(1, idx.cpu(), w.cpu()))
    return {"tokens": [tokenizer.decode([i]) for i in ids], "layers": layers}


def _token_labels(tokens: list[str]) -> list[str]:
    return [f"{i}:{t.replace(' ', '·').replace(chr(10), '⏎')}" for i, t in enumerate(tokens)]


def routing_view(model, tokenizer, snippets: dict[str, str], layer: int = 0) -> Live:
    """A snippet and a layer to choose; a heatmap of tokens (x) by experts (y), coloured by the
    routing weight each token gave each expert (blank = not chosen)."""
    import ipywidgets as W

    names = list(snippets)
    pick = W.Dropdown(options=names, value=names[0], description="snippet")
    layer_box = W.IntSlider(value=layer, min=0, max=len(moe.moe_blocks(model)) - 1, description="layer")
    header = W.HTML()
    fig = go.FigureWidget(go.Heatmap(z=[[0]], colorscale="Viridis", zmin=0, zmax=1, colorbar=dict(title="weight")))
    fig.update_layout(height=330, margin=dict(l=60, r=20, t=50, b=90), yaxis=dict(title="expert", dtick=1),
                      xaxis=dict(title="token", tickangle=-60))

    def redraw(*_):
        r = route_text(model, tokenizer, snippets[pick.value])
        z = r["layers"][layer_box.value].T  # [E, T]
        z = [[v if v > 0 else None for v in row] for row in z.tolist()]  # blank = not chosen (JSON has no NaN)
        labels = _token_labels(r["tokens"])
        chosen = (r["layers"][layer_box.value] > 0).sum(0).tolist()
        with fig.batch_update():
            fig.data[0].update(z=z, x=labels, y=list(range(len(z))))
            fig.layout.title.text = f"layer {layer_box.value}: the experts each token of {pick.value!r} went to"
        header.value = (f"{len(labels)} tokens; choices per expert in this snippet: "
                        + ", ".join(f"<b>{e}</b>: {n}" for e, n in enumerate(chosen)))

    for w in (pick, layer_box):
        w.observe(redraw, names="value")
    redraw()
    box = W.VBox([W.HBox([pick, layer_box]), header, fig])
    return Live(box, fig, header=header, description="routing view")


def expert_load_figure(loads: dict[str, list[list[float]]], num_experts: int, top_k: int) -> go.Figure:
    """Bars: share of routing choices per expert, per layer, for each model; the even share 1/E dashed."""
    fig = go.Figure()
    for label, per_layer in loads.items():
        for li, row in enumerate(per_layer):
            fig.add_bar(x=[f"e{e}" for e in range(num_experts)], y=row, name=f"{label}, layer {li}")
    fig.add_hline(y=1 / num_experts, line_dash="dash", annotation_text="even share 1/E")
    fig.update_layout(title=f"Load per expert (share of top-{top_k} choices) on held-out text", barmode="group",
                      height=380, yaxis=dict(title="share of choices"), margin=dict(l=60, r=20, t=50, b=40))
    return fig


def decode_bytes(spec: dict, batch: int, bits: float = 16) -> dict:
    """Weight bytes and FLOPs of one decode step of an MoE (``spec`` as MIXTRAL_8X7B) at ``batch``,
    with uniform routing: each layer reads the shared weights and the experts some token chose."""
    touched = moe.expected_experts_touched(spec["num_experts"], spec["top_k"], batch)
    params_read = spec["shared"] + touched * spec["per_expert"]
    active = spec["shared"] + spec["top_k"] * spec["per_expert"]
    return {"experts_touched": touched, "bytes": params_read * bits / 8, "flops": 2 * active * batch}


def moe_roofline(spec: dict = MIXTRAL_8X7B, hw: str = "H100 SXM", batch: int = 1) -> Live:
    """A batch slider; three decode steps on ``hw``'s roofline: the MoE, a dense model of its total
    size and a dense model of its active size (weights only, fp16)."""
    import ipywidgets as W

    hardware = roofline.PRESETS[hw]
    total = spec["shared"] + spec["num_experts"] * spec["per_expert"]
    active = spec["shared"] + spec["top_k"] * spec["per_expert"]
    bat = W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=batch, description="batch",
                            continuous_update=False)
    header = W.HTML()
    fig = go.FigureWidget(roofline_figure(hardware, title=f"{spec['name']} decode on {hw}"))
    for name in (f"dense {total / 1e9:.1f}B", f"{spec['name']} (MoE)", f"dense {active / 1e9:.1f}B"):
        fig.add_scatter(x=[1], y=[1], mode="markers+text", name=name, text=[name], textposition="top center",
                        marker=dict(size=13))

    def redraw(*_):
        b = bat.value
        m = decode_bytes(spec, b)
        steps = [(2 * total * b, 2 * total), (m["flops"], m["bytes"]), (2 * active * b, 2 * active)]
        rows = []
        with fig.batch_update():
            xs, ys = _roof_xy(hardware)
            fig.data[0].update(x=xs, y=ys)
            for trace, (flops, nbytes) in zip(fig.data[1:], steps):
                ai = flops / nbytes
                trace.update(x=[ai], y=[hardware.attainable_flops(ai)])
                tps = b / max(nbytes / hardware.mem_bandwidth, flops / hardware.peak_flops)  # the roofline's step time
                rows.append(f"<b>{escape(trace.name)}</b>: reads {nbytes / 1e9:,.1f} GB, ceiling {tps:,.0f} tok/s")
        header.value = (f"batch {b}: the tokens choose on average {m['experts_touched']:.2f} of "
                        f"{spec['num_experts']} experts per layer.<br>" + "<br>".join(rows))

    bat.observe(redraw, names="value")
    redraw()
    return Live(W.VBox([bat, header, fig]), fig, header=header, description="MoE on the roofline")
