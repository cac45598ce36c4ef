"""Figures that are live in JupyterLab and still readable in the static book.

A notebook output can carry several representations of the same thing (a "MIME bundle"); each
front end shows the richest one it understands:

    JupyterLab     application/vnd.jupyter.widget-view+json   a live widget, talking to the kernel
                   application/vnd.plotly.v1+json             a plotly figure (jupyterlab-plotly)
    the book       text/html                                  a static snapshot drawn by plotly.js

The HTML snapshot never points at a CDN: it uses ``window.Plotly`` when the page already loaded
it, and otherwise loads ``_static/plotly.min.js`` relative to the site root (Sphinx writes that
root on every page), which the book build copies from the installed plotly package.

Every figure also carries a ``text/plain`` *structural summary* (:func:`figure_summary`): its
title, axis types and titles, and each trace's kind, name and number of points. That is what
nbval compares. The figure's numbers differ in their low bits from one CPU to the next, so the
plotly JSON is left out of the comparison (``notebooks/conftest.py``) and the HTML snapshot is
replaced by a placeholder (``notebooks/nbval_sanitize.cfg``); the notebooks' assert cells check
those numbers with tolerances instead. The snapshot's element id comes from the summary, never
from the data, so it is the same on every machine.
"""
from __future__ import annotations

import hashlib
import html
import itertools
import json

import plotly.graph_objects as go
import plotly.io as pio

#: Where the static snapshot finds plotly.js, relative to the root of the built site.
PLOTLY_JS_PATH = "_static/plotly.min.js"

_figure_counter = itertools.count()

_LOADER = """<script>
(function () {
  var fig = %(json)s;
  function draw(Plotly) {
    Plotly.newPlot(%(div_id_js)s, fig.data, fig.layout, {responsive: true, displaylogo: false});
  }
  if (window.Plotly) { draw(window.Plotly); return; }
  if (!window.__inferlabPlotly) {
    window.__inferlabPlotly = new Promise(function (resolve, reject) {
      var root = document.documentElement.getAttribute("data-content_root");
      if (root === null) {  // older Sphinx: derive the root from a script it always adds
        var opt = document.querySelector('script[src$="documentation_options.js"]');
        root = opt ? opt.getAttribute("src").replace(/_static\\/documentation_options\\.js$/, "") : "./";
      }
      var s = document.createElement("script");
      s.src = root + %(path_js)s;
      s.onload = function () { resolve(window.Plotly); };
      s.onerror = reject;
      document.head.appendChild(s);
    });
  }
  window.__inferlabPlotly.then(draw);
})();
</script>"""


def figure_json(fig: go.Figure) -> str:
    """The figure as plotly JSON (what both plotly.js and the plotly MIME type consume)."""
    return pio.to_json(go.Figure(fig), validate=False, pretty=False)


def _points(trace) -> str:
    """How many points a trace holds: ``9``, or rows x columns for a heatmap's ``z``."""
    for key in ("z", "x", "y", "values", "r", "lat"):
        value = getattr(trace, key, None) if key in trace else None
        if value is None:
            continue
        if key == "z" and len(value) and hasattr(value[0], "__len__"):
            return f"{len(value)}x{len(value[0])}"
        return str(len(value))
    return "0"


def figure_summary(fig: go.Figure) -> str:
    """The figure's structure as text, the same on every CPU: title, axes, traces (kind, name, points).

    >>> print(figure_summary(go.Figure(go.Bar(x=["a", "b"], y=[1.0, 2.5], name="m"), layout=dict(title="t"))))
    plotly figure: t
      bar 'm': 2 points
    """
    fig = go.Figure(fig)
    lines = [f"plotly figure: {fig.layout.title.text or '(untitled)'}"]
    layout = fig.layout.to_plotly_json()
    for name in sorted(k for k in layout if k.startswith(("xaxis", "yaxis"))):
        axis = fig.layout[name]
        title = axis.title.text if axis.title is not None else None
        if axis.type or title:
            lines.append(f"  {name}: {axis.type or 'auto'}" + (f", title {title!r}" if title else ""))
    for trace in fig.data:
        mode = f" ({trace.mode})" if getattr(trace, "mode", None) else ""
        lines.append(f"  {trace.type} {trace.name!r}{mode}: {_points(trace)} points" if trace.name is not None
                     else f"  {trace.type}{mode}: {_points(trace)} points")
    return "\n".join(lines)


def figure_html(fig: go.Figure) -> str:
    """A self-drawing ``<div>`` + ``<script>`` snapshot of ``fig`` that loads only local plotly.js.

    The div id comes from the figure's structure (:func:`figure_summary`) and a per-process
    counter, never from its numbers: re-running a notebook from the top gives the same ids on any
    CPU, and two figures on one page never share one.
    """
    payload = figure_json(fig)
    digest = hashlib.sha1(figure_summary(fig).encode()).hexdigest()[:10]
    div_id = f"inferlab-fig-{digest}-{next(_figure_counter)}"
    height = (fig.layout.height or 420) if hasattr(fig, "layout") else 420
    safe = payload.replace("</", "<\\/")  # a "</script>" inside a string must not end the tag
    script = _LOADER % {"json": safe, "div_id_js": json.dumps(div_id), "path_js": json.dumps(PLOTLY_JS_PATH)}
    return (f'<div id="{div_id}" class="inferlab-plotly" style="width:100%;height:{int(height)}px">'
            f"</div>\n{script}")


class StaticFigure:
    """Display wrapper for a plotly figure: plotly MIME for JupyterLab, HTML snapshot for the book."""

    def __init__(self, fig: go.Figure, description: str | None = None):
        self.figure = go.Figure(fig)
        self.description = description

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        return {
            "application/vnd.plotly.v1+json": json.loads(figure_json(self.figure)),
            "text/html": figure_html(self.figure),
            "text/plain": (self.description + "\n" if self.description else "") + figure_summary(self.figure),
        }


#: Said above every widget's static snapshot, so a reader of the book knows why nothing moves.
SNAPSHOT_NOTICE = ("<p class=\"inferlab-snapshot-notice\"><em>A snapshot of a live widget, as it was when "
                   "the notebook ran. Its controls work in JupyterLab: open this notebook with "
                   "<code>make lab</code>.</em></p>")
#: Height (px) kept free above a figure's title for plotly's mode bar (it sits at the top right).
MODEBAR_PX = 32
#: One label style on every log axis: a tick per power of ten, SI prefixes past 1000 (0.1, 1, 10, 1k, 1G).
LOG_AXIS = dict(type="log", dtick=1, exponentformat="SI", minor=dict(ticks="outside"))


def style(fig, title: str | None = None, height: int | None = None, log_x: bool = False, log_y: bool = False):
    """The course's figure layout: the title left-aligned below the mode bar (never under it),
    a margin that fits both, and one label style on log axes. Returns ``fig``."""
    height = int(height or fig.layout.height or 420)
    top = MODEBAR_PX + 40
    fig.update_layout(height=height, margin=dict(t=top, l=70, r=20, b=50),
                      title=dict(x=0, xanchor="left", xref="paper", yref="container", yanchor="top",
                                 y=1 - MODEBAR_PX / height, font=dict(size=16)))
    if title is not None:
        fig.update_layout(title_text=title)
    if log_x:
        fig.update_xaxes(**LOG_AXIS)
    if log_y:
        fig.update_yaxes(**LOG_AXIS)
    return fig


class LiveFigure:
    """A plotly figure the kernel redraws, shown in an ipywidgets ``Output``.

    ``.figure`` is a plain ``go.Figure``; ``update(traces, layout)`` changes it and sends the whole
    figure to the browser, where JupyterLab's plotly renderer draws it. Why not plotly's
    ``FigureWidget``: it is an anywidget, and anywidget gives a model 2 seconds to load plotly's
    JavaScript; on a busy machine (Run All while the kernel measures) that fails and the plot
    stays empty or frozen. And its ``batch_update()`` sends a property that did not change as
    ``undefined`` for some traces, which plotly.js draws as no value (notebook 00's decode point
    lost its x that way). A whole figure in one message has neither problem.
    """

    def __init__(self, fig):
        import ipywidgets as W

        self.figure = go.Figure(fig)
        self.widget = W.Output()
        self.widget.add_class("inferlab-live-figure")
        self._send()

    def update(self, traces: dict[int, dict] | None = None, layout: dict | None = None) -> None:
        """Set trace properties (``{index: {"x": [...], ...}}``) and dotted layout paths
        (``{"title.text": ...}``), then redraw."""
        for index, props in (traces or {}).items():
            self.figure.data[index].update(props)
        if layout:
            self.figure.plotly_relayout(dict(layout))
        self._send()

    def _send(self) -> None:
        self.widget.outputs = ({"output_type": "display_data", "metadata": {},
                                "data": {"application/vnd.plotly.v1+json": json.loads(figure_json(self.figure)),
                                         "text/plain": figure_summary(self.figure)}},)


class Live:
    """A live widget (controls + a :class:`LiveFigure`) that also carries a static snapshot.

    In JupyterLab the widget view wins and every control redraws the figure through the kernel
    (a :class:`LiveFigure` redraws it). Where no kernel exists (the book), the ``text/html``
    snapshot shows the figure as it was when the cell ran, under a notice that says so and the
    ``header`` widget's HTML (a readout of the numbers).
    """

    def __init__(self, widget, figure: go.Figure, header=None, description: str = "live figure",
                 snapshots: list | None = None):
        self.widget, self.figure, self.header, self.description = widget, figure, header, description
        #: Figures the book shows instead of ``figure`` alone, one under the other (for a widget whose
        #: point is a comparison between its states, such as two policies).
        self.snapshots = snapshots

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        figures = self.snapshots or [self.figure]
        top = f"<div>{self.header.value}</div>\n" if self.header is not None and not self.snapshots else ""
        bundle["text/html"] = SNAPSHOT_NOTICE + "\n" + top + "\n".join(figure_html(f) for f in figures)
        # ipywidgets' own text/plain is a repr of every child (ids, values): replace it with prose
        bundle["text/plain"] = "\n".join([f"<{self.description}: live in JupyterLab, a static snapshot elsewhere>",
                                          *(figure_summary(f) for f in figures)])
        return bundle


def show(fig) -> StaticFigure:
    """Return a displayable version of ``fig`` (end a cell with it, or pass it to ``display``)."""
    return StaticFigure(fig)


def escape(text: str) -> str:
    return html.escape(str(text), quote=False)
