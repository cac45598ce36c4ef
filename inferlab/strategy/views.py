"""Notebook 07's figures and live views: the cache's precision against hit rate as the threshold
moves, the router's cost against quality, and who runs at each step under priorities."""
from __future__ import annotations

import plotly.graph_objects as go

from inferlab.viz.figures import Live, LiveFigure, style
from inferlab.viz.numbers import percent

COLORS = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"]


def _nearest_row(rows, threshold):
    return min(rows, key=lambda r: abs(r["threshold"] - threshold))


def cache_view(sweeps: dict[str, list[dict]], start: float = 0.6, generate_s: float | None = None) -> Live:
    """A threshold slider over precomputed sweeps ({curve name: questions.sweep rows}): every curve
    as precision against hit rate, the current threshold as a marker on each, and a readout."""
    import ipywidgets as W

    thresholds = [r["threshold"] for r in next(iter(sweeps.values()))]
    slider = W.SelectionSlider(options=[(f"{t:.2f}", t) for t in thresholds],
                               value=min(thresholds, key=lambda t: abs(t - start)), description="threshold",
                               continuous_update=False)
    header = W.HTML()
    names = list(sweeps)

    def state():
        t = slider.value
        traces, lines = {}, []
        for i, name in enumerate(names):
            r = _nearest_row(sweeps[name], t)
            traces[len(names) + i] = dict(x=[r["hit_rate"]], y=[r["precision"]])
            saved = "" if generate_s is None else f", saves {percent(r['hit_rate'])} of {generate_s * 1e3:.0f} ms"
            lines.append(f"<b>{name}</b>: hit rate {percent(r['hit_rate'])}, precision {percent(r['precision'])}, "
                         f"{r['wrong']} wrong answers served, recall {percent(r['recall'])}{saved}")
        header.value = "<br>".join(lines)
        return traces, f"Semantic cache at threshold {t:.2f}: precision against hit rate"

    traces, title = state()
    fig = go.Figure()
    for i, name in enumerate(names):
        rows = sweeps[name]
        fig.add_scatter(x=[r["hit_rate"] for r in rows], y=[r["precision"] for r in rows], mode="lines+markers",
                        name=name, line=dict(color=COLORS[i]), marker=dict(size=5),
                        text=[f"threshold {r['threshold']:.2f}" for r in rows])
    for i, name in enumerate(names):
        fig.add_scatter(mode="markers", name=f"{name} (now)", showlegend=False,
                        marker=dict(size=15, color=COLORS[i], symbol="circle-open", line=dict(width=3)), **traces[len(names) + i])
    fig.update_xaxes(title="hit rate (share of requests served from the cache)", range=[0, 1.02])
    fig.update_yaxes(title="precision (right answers / served)", range=[0, 1.05])
    plot = LiveFigure(style(fig, title))
    slider.observe(lambda *_: plot.update(*_split(state())), names="value")
    return Live(W.VBox([slider, header, plot.widget]), plot.figure, header, "semantic cache threshold")


def _split(state):
    traces, title = state
    return traces, {"title.text": title}


def router_view(curves: dict[str, list[dict]], start_share: float = 0.3) -> Live:
    """A routing-threshold slider (as the share sent to the small model) over router sweeps:
    cost (relative to all-large) against quality (large ppl / routed ppl), the current point marked."""
    import ipywidgets as W

    first = next(iter(curves.values()))
    shares = [r["small_share"] for r in first]
    slider = W.SelectionSlider(options=[(percent(s, 2), i) for i, s in enumerate(shares)],
                               value=min(range(len(shares)), key=lambda i: abs(shares[i] - start_share)),
                               description="to small", continuous_update=False)
    header = W.HTML()
    names = list(curves)

    def state():
        i = slider.value
        traces, lines = {}, []
        for k, name in enumerate(names):
            r = curves[name][i]
            traces[len(names) + k] = dict(x=[r["cost"]], y=[r["quality"]])
            lines.append(f"<b>{name}</b>: {percent(r['small_share'])} to the small model, cost {percent(r['cost'])} "
                         f"of all-large, perplexity {r['ppl']:.1f}, quality {percent(r['quality'])}, "
                         f"agreement with the large model {percent(r['agreement'])}")
        header.value = "<br>".join(lines)
        return traces, f"Router: {percent(first[i]['small_share'])} of requests to the small model"

    traces, title = state()
    fig = go.Figure()
    for k, name in enumerate(names):
        rows = curves[name]
        fig.add_scatter(x=[r["cost"] for r in rows], y=[r["quality"] for r in rows], mode="lines+markers",
                        name=name, line=dict(color=COLORS[k]), marker=dict(size=5))
    for k, name in enumerate(names):
        fig.add_scatter(mode="markers", name=f"{name} (now)", showlegend=False,
                        marker=dict(size=15, color=COLORS[k], symbol="circle-open", line=dict(width=3)), **traces[len(names) + k])
    # the label sits under the line at the left, where every curve is far below it (little goes to the
    # large model there), on a white box, so no curve runs through it
    fig.add_hline(y=0.95, line=dict(dash="dot", color="grey"), annotation_text="95% of the large model's quality",
                  annotation_position="bottom left", annotation_bgcolor="rgba(255,255,255,0.85)")
    fig.update_xaxes(title="cost (share of sending every request to the large model)")
    fig.update_yaxes(title="quality (large ppl / routed ppl)")
    plot = LiveFigure(style(fig, title))
    slider.observe(lambda *_: plot.update(*_split(state())), names="value")
    return Live(W.VBox([slider, header, plot.widget]), plot.figure, header, "router threshold")


def priority_figure(traces: dict, background_prefix: str = "precompute-") -> go.Figure:
    """Running sequences per engine step, interactive and background, for each run ({name: Trace})."""
    fig = go.Figure()
    for k, (name, trace) in enumerate(traces.items()):
        inter = [sum(not r.startswith(background_prefix) for r in run) for run in trace.running]
        bg = [sum(r.startswith(background_prefix) for r in run) for run in trace.running]
        fig.add_scatter(y=inter, mode="lines", name=f"{name}: interactive", line=dict(color=COLORS[k], shape="hv"))
        if any(bg):
            fig.add_scatter(y=bg, mode="lines", name=f"{name}: background", line=dict(color=COLORS[2], shape="hv", dash="dot"))
    fig.update_xaxes(title="engine step")
    fig.update_yaxes(title="running sequences")
    return style(fig, "Who runs at each step: interactive requests first, the precompute job in the gaps")
