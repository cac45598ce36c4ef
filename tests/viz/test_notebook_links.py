"""No dead links in the lessons: every relative link in a notebook's markdown (to another
notebook, a lab README, a file) points at a file of the course, in the repository as in the
workspace copy (`make lab`), which keeps notebooks/ and labs/ side by side."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_relative_link_resolves(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    links = [l for l in LINK.findall(text) if not re.match(r"[a-z]+:", l) and not l.startswith("#")]
    dead = [l for l in links if not (notebook.parent / l.split("#")[0]).exists()]
    assert not dead, f"{notebook.name} links to files that do not exist: {dead}"
