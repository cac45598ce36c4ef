"""The list `make mutants` runs stays true to the code: each bug's text is found exactly once in its
file, each named test file exists, and applying a bug really changes the file (a stale entry would
otherwise only show when `make mutants` runs)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
mutants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutants)
LIST = mutants.load(ROOT / "scripts" / "mutants.toml")


def test_the_issue_bugs_and_at_least_ten_more_are_listed():
    names = {m["name"] for m in LIST}
    assert {"sampler-temperature-last", "int8-scale-255", "int4-sym-range", "stream-choice-index",
            "fork-recomputes-prompt"} <= names
    assert len(names) >= 15
    areas = {m["file"].split("/")[1] if m["file"].startswith("inferlab/") else "kernels" for m in LIST}
    assert {"sampling.py", "quant", "engine", "serve", "kernels"} <= areas


@pytest.mark.parametrize("m", LIST, ids=[m["name"] for m in LIST])
def test_each_bug_applies_once_and_names_existing_tests(m):
    text = (ROOT / m["file"]).read_text()
    mutated = mutants.apply(text, m["edits"])
    assert mutated != text
    if m["file"].endswith(".py"):
        compile(mutated, m["file"], "exec")
    for t in m["tests"]:
        path, _, name = t.partition("::")
        assert (ROOT / path).is_file(), t
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), t
