"""Notebook helpers shared by every lesson: figures, diagrams, progress, seeds, the demo model.

    from inferlab import viz
    viz.seed_everything(0)
    viz.mermaid(viz.flowchart(...))     # a diagram JupyterLab draws itself (no web service)
    viz.show(fig)                       # a plotly figure: interactive in JupyterLab, static in the book
    viz.roofline_calculator()           # sliders + a viz.LiveFigure the kernel redraws
    viz.count(7.08e9), viz.si(140e9, "B")   # '7.08B', '140 GB': numbers for people

`python -m inferlab.viz.workspace lab` (what `make lab` runs) opens JupyterLab on a git-ignored
copy of notebooks/ and labs/, so running notebooks and editing starters never dirties git.
"""
from inferlab.viz.kv_blocks import block_pool, pool_figure, record_trace
from inferlab.viz.diagrams import Diagram, flowchart, mermaid, mermaid_text
from inferlab.viz.figures import (PLOTLY_JS_PATH, SNAPSHOT_NOTICE, Live, LiveFigure, StaticFigure, figure_html,
                                   figure_summary, show, style)
from inferlab.viz.notebook import demo_model, progress, seed_everything, tiny_random_model
from inferlab.viz import batching_plots, moe_plots, quant_explorer
from inferlab.viz.numbers import count, number, percent, si
from inferlab.viz.roofline_plot import above_roof, attainable_flops, roof_share, roofline_calculator, roofline_figure

__all__ = [
    "block_pool", "pool_figure", "record_trace",
    "Diagram", "flowchart", "mermaid", "mermaid_text",
    "PLOTLY_JS_PATH", "SNAPSHOT_NOTICE", "Live", "LiveFigure", "StaticFigure", "figure_html", "figure_summary",
    "show", "style",
    "count", "number", "percent", "si",
    "demo_model", "progress", "seed_everything", "tiny_random_model",
    "batching_plots", "moe_plots", "quant_explorer", "above_roof", "attainable_flops", "roof_share", "roofline_calculator", "roofline_figure",
]
