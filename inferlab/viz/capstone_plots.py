"""Notebook 08's views of the capstone's runs: what each deployment answered, beside the quality
measures that summarise it.

``answers_view`` is the widget: pick a customer's request and read every deployment's answer to
it, each marked grounded or not (it states the FAQ fact of the question's intent), above a chart
of the share of grounded answers per deployment, where the picked request's own mark sits on
each bar. A reader checks the measure against the text it was computed from.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from inferlab.viz.figures import Live, LiveFigure, style


def _marks(results: dict[str, dict], index: int) -> list[float | None]:
    """1 or 0: is each deployment's answer to request ``index`` grounded (the run's own check,
    ``grounded_by_request``); None when the question has no FAQ fact (out of scope)."""
    return [None if (g := r["grounded_by_request"].get(f"r{index}")) is None else float(g) for r in results.values()]


def quality_figure(results: dict[str, dict], workload: list[dict], index: int | None = None) -> go.Figure:
    """Bars: the share of grounded answers per deployment; markers: request ``index``'s own."""
    names = list(results)
    fig = go.Figure()
    fig.add_bar(x=names, y=[round(r["grounded"], 3) for r in results.values()], name="grounded share, all requests")
    marks = _marks(results, index) if index is not None else [None] * len(names)
    shown = [(n, m, r["answers"][f"r{index}"]) for (n, r), m in zip(results.items(), marks) if m is not None]
    fig.add_scatter(x=[n for n, _, _ in shown], y=[m for _, m, _ in shown], mode="markers",
                    name="this request (1: grounded)", text=[a[:90] for _, _, a in shown],
                    hovertemplate="%{x}: %{text}<extra></extra>",
                    marker=dict(size=14, symbol="diamond", color="#d62728"))
    fig.update_xaxes(title="deployment (each adds one technique)", tickangle=-30, automargin=True)
    fig.update_yaxes(title="grounded answers", range=[0, 1.05])
    question = workload[index]["question"] if index is not None else ""
    style(fig, f"Answers that state the FAQ fact: {question!r}" if question else "Answers that state the FAQ fact",
          height=460)
    fig.update_layout(margin=dict(b=140), legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


def answers_table(results: dict[str, dict], workload: list[dict], index: int) -> str:
    """HTML: the question, its intent, and every deployment's answer with its grounded mark."""
    w = workload[index]
    marks = _marks(results, index)
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(r['answers'][f'r{index}'])}</td>"
        f"<td>{'-' if m is None else 'yes' if m else 'no'}</td></tr>"
        for (name, r), m in zip(results.items(), marks))
    return (f"<p><b>{html.escape(w['question'])}</b> (intent: {html.escape(str(w['label']))})</p>"
            f"<table><tr><th>deployment</th><th>answer</th><th>grounded</th></tr>{rows}</table>")


def answers_view(results: dict[str, dict], workload: list[dict], first: int = 0) -> Live:
    """A dropdown over the requests; the answers table and the chart redraw for the one picked."""
    import ipywidgets as W

    options = [(f"r{i}: {w['question']}", i) for i, w in enumerate(workload)]
    pick = W.Dropdown(options=options, value=first, description="request", layout=W.Layout(width="95%"))
    header = W.HTML()
    live = LiveFigure(quality_figure(results, workload, first))

    def redraw(*_):
        new = quality_figure(results, workload, pick.value)
        live.update({1: {"x": list(new.data[1].x), "y": list(new.data[1].y), "text": list(new.data[1].text)}},
                    {"title.text": new.layout.title.text})
        header.value = answers_table(results, workload, pick.value)

    pick.observe(redraw, names="value")
    redraw()
    return Live(W.VBox([pick, header, live.widget]), live.figure, header=header, description="answers side by side")
