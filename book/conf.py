"""Sphinx configuration of the course book (myst-nb + sphinx-book-theme), built offline.

Build with `make book` (python -m book.build). Plain `sphinx-build book book/_build/html` works
too: this file runs the same preparation (local scripts, mirrored notebooks and lab pages).
"""
import sys
from pathlib import Path

BOOK = Path(__file__).resolve().parent
sys.path.insert(0, str(BOOK.parent))

from book.build import prepare  # noqa: E402

prepare()

project = "inferlab"
author = "the inferlab authors"
copyright = "inferlab authors, MIT license"
html_title = "inferlab: efficient LLM inference, taught by building it"

extensions = [
    "myst_nb",
    "sphinxcontrib.mermaid",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
]
exclude_patterns = ["_build", "_static_local", "**/.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# ---- MyST: math with $...$, and ```mermaid fences become diagrams (in pages and in notebooks)
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_fence_as_directive = ["mermaid"]
myst_heading_anchors = 3

# ---- notebooks: show the outputs stored in the files (the ones nbval checks), never re-run
nb_execution_mode = "off"
# outputs given as markdown (our mermaid diagrams) are parsed as MyST, so the fence is a diagram
nb_render_markdown_format = "myst"
# A live widget has no kernel in a static page: show the HTML snapshot each of our widgets
# carries instead of the widget view, and load no widget JavaScript (it comes from a CDN).
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.jupyter.widget-state+json", None),
]
nb_ipywidgets_js = {}

# ---- the scripts that draw things, served from _static/ (copied from book/_static_local)
html_static_path = ["_static", "_static_local"]
mathjax_path = "mathjax/tex-mml-chtml.js"  # relative to _static/
# sphinxcontrib-mermaid turns the directive into <pre class="mermaid">; we draw those with the
# local mermaid.min.js (a classic script, so it also works from file://) instead of its CDN module.
mermaid_output_format = "raw"
plotly_js = "plotly.min.js"

# ---- theme: no launch or thebe buttons (they point at online services)
html_theme = "sphinx_book_theme"
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": True,
    "use_repository_button": False,
    "launch_buttons": {},
    "navigation_with_keys": False,
}
html_copy_source = True
html_show_sourcelink = False
html_last_updated_fmt = None


def _install_local_scripts(app, pagename, templatename, context, doctree):
    """Per page: mermaid (+ our init) where a diagram is; plotly.js where a notebook draws one."""
    from sphinxcontrib.mermaid import mermaid as mermaid_node

    if doctree is None:
        return
    if doctree.next_node(mermaid_node) is not None:
        app.add_js_file("mermaid/mermaid.min.js")
        app.add_js_file("mermaid-init.js")
    if "inferlab-plotly" in str(context.get("body", "")) or "Plotly.newPlot" in str(context.get("body", "")):
        app.add_js_file(plotly_js)


def setup(app):
    # Drop sphinxcontrib-mermaid's page hook: it imports mermaid as an ES module from a CDN.
    from sphinxcontrib.mermaid import install_js

    for listener in list(app.events.listeners.get("html-page-context", [])):
        if listener.handler is install_js:
            app.disconnect(listener.id)
    app.connect("html-page-context", _install_local_scripts)
    app.add_css_file("inferlab.css")
suppress_warnings = ["mystnb.unknown_mime_type"]  # the plotly and mermaid MIME types: the HTML/markdown twin is shown
