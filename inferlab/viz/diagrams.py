"""Mermaid diagrams drawn by the front end itself, with no web service involved.

We build the diagram text with mermaid-py's script builders (``FlowChart``, ``Node``, ``Link``:
pure string building) and hand that text to the notebook as output. We never construct
``mermaid.Mermaid(...)``: it sends the diagram to a remote rendering service.

The output bundle carries the diagram twice:

    text/vnd.mermaid   JupyterLab's mermaid renderer (JupyterLab >= 4.1) draws it
    text/markdown      a ```mermaid fence: JupyterLab's markdown renderer draws it with the same
                       mermaid, and the book (myst-nb) turns it into its mermaid directive

JupyterLab ranks markdown (60) just above the mermaid renderer (61), so in practice the fence is
what it shows; both paths end in JupyterLab's bundled mermaid, offline.
"""
from __future__ import annotations

from mermaid.flowchart import FlowChart, Link, Node

MERMAID_MIME = "text/vnd.mermaid"


def mermaid_text(diagram) -> str:
    """Mermaid source of a mermaid-py builder object (or of a string).

    mermaid-py starts every script with a ``---\ntitle: ...\n---`` front-matter block. We drop it:
    inside a MyST fence a leading ``---`` block is read as the directive's options, and the
    notebook's own heading already names the diagram.
    """
    text = diagram if isinstance(diagram, str) else diagram.script
    text = text.lstrip("\n")
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end != -1:
            text = text[end + 4:].lstrip("\n")
    return text


class Diagram:
    """Display wrapper: ``Diagram(flowchart)`` as the last expression of a cell draws it."""

    def __init__(self, diagram):
        self.script = mermaid_text(diagram).strip() + "\n"

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        return {
            MERMAID_MIME: self.script,
            "text/markdown": f"```mermaid\n{self.script}```\n",
            "text/plain": self.script,
        }


def mermaid(diagram) -> Diagram:
    """Return a displayable diagram from a mermaid-py builder (``FlowChart(...)``) or raw text."""
    return Diagram(diagram)


def flowchart(title: str, nodes: list[tuple[str, str]], edges: list[tuple[str, str] | tuple[str, str, str]],
              orientation: str = "LR", links: dict[str, str] | None = None) -> FlowChart:
    """A flowchart from plain data: ``nodes`` = [(id, label)], ``edges`` = [(src, dst[, label])].

    ``links`` maps a node id to a URL; mermaid turns the node into a link where the page allows
    it (JupyterLab's strict security mode ignores clicks, so also list the links in markdown).
    """
    links = links or {}
    made = {nid: Node(nid, label, href=links.get(nid), href_type="self") for nid, label in nodes}
    arrows = [Link(made[e[0]], made[e[1]], message=e[2] if len(e) > 2 else "") for e in edges]
    return FlowChart(title, list(made.values()), arrows, orientation=orientation)
