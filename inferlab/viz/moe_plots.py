"""Notebook 06's figures: which experts each token chose, load per expert, and MoE on the roofline."""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from inferlab import roofline

from inferlab.model import moe
from inferlab.viz.figures import Live, LiveFigure, escape, style

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

    def state() -> tuple[dict[int, dict], str]:
        """The heatmap's data and the title for the current snippet and layer; sets the readout."""
        r = route_text(model, tokenizer, snippets[pick.value])
        z = r["layers"][layer_box.value].T  # [E, T]
        z = [[v if v > 0 else None for v in row] for row in z.tolist()]  # blank = not chosen (JSON has no NaN)
        labels = _token_labels(r["tokens"])
        chosen = (r["layers"][layer_box.value] > 0).sum(0).tolist()
        header.value = (f"{len(labels)} tokens; choices per expert in this snippet: "
                        + ", ".join(f"<b>{e}</b>: {n}" for e, n in enumerate(chosen)))
        title = f"layer {layer_box.value}: the experts each token of {pick.value!r} went to"
        return {0: dict(z=z, x=labels, y=list(range(len(z))))}, title

    # The figure starts from the controls' real values (no placeholder for a later update to replace).
    traces, title = state()
    fig = go.Figure(go.Heatmap(colorscale="Viridis", zmin=0, zmax=1, colorbar=dict(title="weight"), **traces[0]))
    fig.update_layout(yaxis=dict(title="expert", dtick=1), xaxis=dict(title="token", tickangle=-60))
    style(fig, title, height=360)
    fig.update_layout(margin=dict(b=90))  # room for the slanted token labels
    plot = LiveFigure(fig)

    def redraw(*_):
        traces, title = state()
        plot.update(traces, {"title.text": title})

    for w in (pick, layer_box):
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox([pick, layer_box]), header, plot.widget])
    return Live(box, plot.figure, header=header, description="routing view")


def expert_load_figure(loads: dict[str, list[list[float]]], num_experts: int, top_k: int) -> go.Figure:
    """Bars: share of routing choices per expert, per layer, for each model; the even share 1/E dashed."""
    fig = go.Figure()
    for label, per_layer in loads.items():
        for li, row in enumerate(per_layer):
            fig.add_bar(x=[f"e{e}" for e in range(num_experts)], y=row, name=f"{label}, layer {li}")
    fig.add_hline(y=1 / num_experts, line_dash="dash", annotation_text="even share 1/E",
                  annotation_position="top left")  # left: clear of the last expert's bars
    fig.update_layout(barmode="group", yaxis=dict(title="share of choices"))
    return style(fig, f"Load per expert (share of top-{top_k} choices) on held-out text", height=400)


def decode_bytes(spec: dict, batch: int, bits: float = 16) -> dict:
    """Weight bytes and FLOPs of one decode step of an MoE (``spec`` as MIXTRAL_8X7B) at ``batch``,
    with uniform routing: each layer reads the shared weights and the experts some token chose."""
    touched = moe.expected_experts_touched(spec["num_experts"], spec["top_k"], batch)
    params_read = spec["shared"] + touched * spec["per_expert"]
    active = spec["shared"] + spec["top_k"] * spec["per_expert"]
    return {"experts_touched": touched, "bytes": params_read * bits / 8, "flops": 2 * active * batch}


BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def decode_ceiling(flops: float, nbytes: float, batch: int, hardware) -> float:
    """Tokens/s a decode step can reach on ``hardware``'s roofline: ``batch`` tokens per step,
    a step no shorter than its bytes over the bandwidth nor its FLOPs over the peak."""
    return batch / max(nbytes / hardware.mem_bandwidth, flops / hardware.peak_flops)


def moe_roofline(spec: dict = MIXTRAL_8X7B, hw: str = "H100 SXM", batch: int = 1) -> Live:
    """A batch slider; the decode ceiling (tokens/s, weights only, fp16) against the batch for
    three models on ``hw``: the MoE, a dense model of its total size and one of its active size.
    The MoE's curve leaves the small model's at batch 1 (it reads only the chosen experts) and
    joins the large one's once a batch's tokens touch every expert."""
    import ipywidgets as W

    hardware = roofline.PRESETS[hw]
    total = spec["shared"] + spec["num_experts"] * spec["per_expert"]
    active = spec["shared"] + spec["top_k"] * spec["per_expert"]
    bat = W.SelectionSlider(options=BATCHES, value=batch, description="batch", continuous_update=False)
    header = W.HTML()
    names = (f"dense {total / 1e9:.1f}B", f"{spec['name']} (MoE)", f"dense {active / 1e9:.1f}B")

    def steps(b: int) -> list[tuple[float, float]]:
        """(FLOPs, bytes) of one decode step of each model at batch ``b``."""
        m = decode_bytes(spec, b)
        return [(2 * total * b, 2 * total), (m["flops"], m["bytes"]), (2 * active * b, 2 * active)]

    curves = [[decode_ceiling(*steps(b)[i], b, hardware) for b in BATCHES] for i in range(3)]

    def state() -> dict[int, dict]:
        """The three models' points at the slider's batch; sets the readout."""
        b = bat.value
        rows = []
        for name, (flops, nbytes) in zip(names, steps(b)):
            rows.append(f"<b>{escape(name)}</b>: reads {nbytes / 1e9:,.1f} GB per step, ceiling "
                        f"{decode_ceiling(flops, nbytes, b, hardware):,.0f} tok/s")
        header.value = (f"batch {b}: the tokens choose on average "
                        f"{decode_bytes(spec, b)['experts_touched']:.2f} of {spec['num_experts']} experts per "
                        "layer.<br>" + "<br>".join(rows))
        return {3 + i: dict(x=[b], y=[curves[i][BATCHES.index(b)]]) for i in range(3)}

    colors = ("#d62728", "#9467bd", "#2ca02c")
    fig = go.Figure()
    for name, curve, color in zip(names, curves, colors):
        fig.add_scatter(x=BATCHES, y=curve, mode="lines", name=name, line=dict(color=color, width=3 if "MoE" in name else 2,
                                                                             dash=None if "MoE" in name else "dot"))
    # The figure starts from the slider's real value (no placeholder for a later update to replace).
    for i, (name, color) in enumerate(zip(names, colors)):  # the MoE's marker smaller, on top of a dense one's
        fig.add_scatter(mode="markers", name=f"{name} at this batch", showlegend=False, **state()[3 + i],
                        marker=dict(size=9 if "MoE" in name else 15, color=color, line=dict(width=1, color="#000")))
    style(fig, f"{spec['name']} decode on {hw}: the ceiling in tokens/s, by batch", height=440, log_x=True, log_y=True)
    fig.update_layout(xaxis=dict(title="batch (sequences decoding together)", dtick=None, tickvals=BATCHES,
                                 minor=dict(ticks="")),
                      yaxis=dict(title="tokens/s (roofline ceiling, weights only)"),
                      legend=dict(orientation="h", y=-0.2))
    plot = LiveFigure(fig)
    bat.observe(lambda *_: plot.update(state()), names="value")
    return Live(W.VBox([bat, header, plot.widget]), plot.figure, header=header, description="MoE on the roofline")
