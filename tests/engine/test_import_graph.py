"""The house has no import circles: every inferlab module imports, and the graph of who imports
whom (read from the source, function-level imports and those under ``if TYPE_CHECKING:``
included) has no cycle. A circle makes the import order matter, forces imports into function
bodies or behind TYPE_CHECKING, and says two modules should be one or share a third (or an
interface: a Protocol); each shared helper has one home instead."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import inferlab

ROOT = Path(inferlab.__file__).parent


def module_names() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports_of(name: str, modules: set[str]) -> set[str]:
    """inferlab modules ``name`` imports anywhere in its source (``from pkg import sub`` counts as
    importing ``pkg.sub`` when that is a module; a package's implicit parent imports do not count)."""
    path = ROOT.parent / (name.replace(".", "/") + ("/__init__.py" if (ROOT.parent / name.replace(".", "/")).is_dir() else ".py"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # TYPE_CHECKING imports count too
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (as a path that returns to its start), or None: depth-first search with colours."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("name", [n for n in module_names() if not n.endswith("__main__")])
def test_every_module_imports(name):
    importlib.import_module(name)


def test_the_import_graph_has_no_cycle():
    modules = set(module_names())
    graph = {m: imports_of(m, modules) for m in modules}
    assert find_cycle(graph) is None, "import circle: " + " -> ".join(find_cycle(graph))
