"""Notebook helpers shared by every lesson: figures, diagrams, progress, seeds, the demo model.

    from inferlab import viz
    viz.seed_everything(0)
    viz.mermaid(viz.flowchart(...))     # a diagram JupyterLab draws itself (no web service)
    viz.show(fig)                       # a plotly figure: interactive in JupyterLab, static in the book
    viz.roofline_calculator()           # sliders + a live FigureWidget
"""
from inferlab.viz.kv_blocks import block_pool, pool_figure, record_trace
from inferlab.viz.diagrams import Diagram, flowchart, mermaid, mermaid_text
from inferlab.viz.figures import PLOTLY_JS_PATH, Live, StaticFigure, figure_html, show
from inferlab.viz.notebook import demo_model, progress, seed_everything, tiny_random_model
from inferlab.viz import batching_plots, moe_plots
from inferlab.viz.roofline_plot import attainable_flops, roofline_calculator, roofline_figure

__all__ = [
    "Diagram", "flowchart", "mermaid", "mermaid_text",
    "PLOTLY_JS_PATH", "Live", "StaticFigure", "figure_html", "show",
    "demo_model", "progress", "seed_everything", "tiny_random_model",
    "batching_plots", "moe_plots", "attainable_flops", "roofline_calculator", "roofline_figure",
]
