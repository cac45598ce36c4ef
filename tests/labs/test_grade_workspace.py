"""`inferlab grade` grades the student's own file: the workspace copy, from wherever the command
the course gives is typed (a notebook cell, a JupyterLab terminal, the repository's root)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab import grade, labkit
from inferlab.viz import workspace as ws

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LAB_READMES = sorted((REPO / "labs").glob("[0-9][0-9]_*/README.md"))
CELL_CMD = re.compile(r"^!(inferlab grade [^\s`]+)", re.M)  # in a fenced block: a notebook cell
TERMINAL_CMD = re.compile(r"(?:`|^)(inferlab grade [^\s`]+)", re.M)  # inline or fenced: a terminal


def your_turn_commands(text: str) -> list[tuple[str, str]]:
    """(folder, command): cell commands run in notebooks/, terminal ones in the workspace root."""
    cells = [("notebooks", c) for c in CELL_CMD.findall(text)]
    terminals = [(".", c) for c in TERMINAL_CMD.findall(text)]
    return cells + terminals


def notebook_text(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("source", NOTEBOOKS + LAB_READMES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_and_readme_gives_a_command_for_its_lab(source):
    text = notebook_text(source) if source.suffix == ".ipynb" else source.read_text()
    commands = your_turn_commands(text)
    assert commands, f"{source.name} gives no `inferlab grade` command"
    folders = {folder for folder, _ in commands}
    if source.suffix == ".ipynb":
        assert folders == {"notebooks", "."}, f"{source.name}: give the cell form and the terminal form"
    for _, cmd in commands:
        assert (REPO / "labs" / Path(cmd.split()[2]).name).is_dir(), f"{source.name}: {cmd} names no lab"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_cell_names_its_lab_by_its_path_from_the_notebooks_folder(notebook):
    """One form in every notebook: a cell runs in notebooks/, so ``../labs/NN`` is the lab's own
    path from there (as the notebook's links are), whatever the grader does with it."""
    cells = [cmd for folder, cmd in your_turn_commands(notebook_text(notebook)) if folder == "notebooks"]
    assert cells, f"{notebook.name} gives no cell command"
    for cmd in cells:
        typed = Path(cmd.split()[2])
        assert typed.parts[:2] == ("..", "labs"), f"{notebook.name}: write the cell as `!inferlab grade ../labs/NAME`"
        assert (notebook.parent / typed / "test_lab.py").is_file(), f"{notebook.name}: {cmd} names no lab"


@pytest.fixture()
def course(tmp_path, monkeypatch):
    """A course checkout (labs/, notebooks/) with its workspace, as `make lab` leaves them."""
    root = tmp_path / "course"
    for folder in ("labs", "notebooks"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    ws.sync(root)
    monkeypatch.setattr(grade, "REPO_ROOT", root)
    return root


@pytest.mark.parametrize("typed, cwd", [
    ("labs/02_kv_cache", "."),                        # the repository's root
    ("labs/02_kv_cache", "workspace"),                # a JupyterLab terminal
    ("../labs/02_kv_cache", "workspace/notebooks"),   # a notebook cell, relative
    ("labs/02_kv_cache", "workspace/notebooks"),      # a notebook cell, as the terminal form
    ("02_kv_cache", "labs"),                          # just the name, anywhere in the course
])
def test_the_workspace_copy_is_graded_from_any_folder(course, typed, cwd):
    assert grade.resolve_lab(typed, course / cwd) == (course / "workspace/labs/02_kv_cache").resolve()


def test_a_workspace_outside_the_course_is_found_from_inside_it(course, tmp_path):
    other = tmp_path / "elsewhere"
    ws.sync(course, other)
    assert grade.resolve_lab("labs/00_roofline", other / "notebooks") == (other / "labs/00_roofline").resolve()
    absolute = course / "labs/00_roofline"  # an absolute path is graded as given
    assert grade.resolve_lab(absolute, other / "notebooks") == absolute.resolve()


def test_without_a_workspace_the_course_starter_is_graded_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(grade, "find_workspace", lambda cwd: None)
    lab = grade.resolve_lab("labs/00_roofline", REPO)
    assert lab == (REPO / "labs/00_roofline").resolve()
    shipped = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD", "--", "labs/00_roofline/starter.py"])
    if shipped.returncode != 0:
        pytest.skip("labs/00_roofline/starter.py has uncommitted edits here")
    note = grade.starter_note(lab)
    assert note and "untouched" in note and "\n" not in note


def test_a_workspace_made_by_hand_is_found_from_the_repository_root(tmp_path, monkeypatch):
    """A ``workspace/labs/NN`` copied by hand (no manifest) is still the student's copy."""
    root = tmp_path / "course"
    shutil.copytree(REPO / "labs", root / "labs", ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copytree(root / "labs/00_roofline", root / "workspace/labs/00_roofline")
    monkeypatch.setattr(grade, "REPO_ROOT", root)
    mine = (root / "workspace/labs/00_roofline").resolve()
    for cwd in (root, root / "labs", root / "workspace"):
        assert grade.resolve_lab("labs/00_roofline", cwd) == mine, f"typed in {cwd}"
    note = grade.redirect_note("labs/00_roofline", root, mine)
    assert note and str(root / "labs/00_roofline") in note and "\n" not in note
    assert grade.redirect_note("labs/00_roofline", root / "workspace", mine) is None


def _solve_one_function(lab: Path) -> str:
    """Edit the lab's starter as a student would: write its first function, by calling inferlab's."""
    spec = importlib.util.spec_from_file_location(f"_probe_{lab.name}", lab / "test_lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    adapter = next(v for v in vars(module).values() if isinstance(v, labkit.Implementation))
    name, attr = next(iter(adapter._names.items()))
    with (lab / "starter.py").open("a") as f:
        f.write(f"\n\nfrom {adapter.reference} import {attr} as {name}  # noqa: E402,F811\n")
    return name


def _grade(cmd: str, cwd: Path) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-m", "inferlab", *cmd.split()[1:]], cwd=cwd, capture_output=True,
                         text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode in (0, 1), out.stderr[-2000:]
    graded = re.search(r"^lab \S+: grading (\S+)$", out.stdout, re.M)
    score = re.search(r"^score: ([\d.]+)/", out.stdout, re.M)
    assert graded and score, out.stdout[-2000:]
    return graded.group(1), float(score.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_your_turn_command_grades_the_edited_workspace_starter(tmp_path, notebook):
    space = tmp_path / "workspace"
    ws.sync(REPO, space)
    commands = your_turn_commands(notebook_text(space / "notebooks" / notebook.name))
    cell = next(cmd for folder, cmd in commands if folder == "notebooks")
    lab = (space / "labs" / Path(cell.split()[2]).name).resolve()
    for folder, cmd in commands:  # the terminal form, typed in the terminal's folder, means the same file
        assert grade.resolve_lab(cmd.split()[2], space / folder) == lab, f"`{cmd}` in {folder}/"
    # Before the edit: the untouched copy, which scores 0 (test_labs.py grades every untouched starter)
    assert "untouched" in (grade.starter_note(lab) or "")
    name = _solve_one_function(lab)
    assert grade.starter_note(lab) is None
    path, after = _grade(cell, space / "notebooks")
    assert path == str(lab / "starter.py"), f"`!{cell}` in a cell graded {path}"
    assert after > 0, f"`!{cell}`: writing {name}() in the workspace copy left the score at 0"


def test_the_solved_workspace_copy_is_graded_from_the_repository_root(tmp_path):
    """As a new user meets it: a solved ``workspace/labs/00_roofline`` and the course's own
    ``labs/00_roofline`` both exist, and the command is typed in the repository's root."""
    root = tmp_path / "course"
    shutil.copytree(REPO / "labs", root / "labs", ignore=shutil.ignore_patterns("__pycache__", "results"))
    mine = root / "workspace/labs/00_roofline"
    shutil.copytree(root / "labs/00_roofline", mine)
    _solve_one_function(mine)
    path, score = _grade("inferlab grade labs/00_roofline", root)
    assert path == str(mine.resolve() / "starter.py")
    assert score > 0


def test_a_lab_copied_anywhere_grades_without_labs_conftest(tmp_path):
    """The grader brings its own pytest plugin: no labs/conftest.py above a student's own folder."""
    lab = tmp_path / "my_course_work" / "00_roofline"
    shutil.copytree(REPO / "labs/00_roofline", lab, ignore=shutil.ignore_patterns("__pycache__"))
    assert not any((folder / "conftest.py").exists() for folder in lab.parents)
    _solve_one_function(lab)
    path, score = _grade(f"inferlab grade {lab.name}", lab.parent)
    assert path == str(lab.resolve() / "starter.py")
    assert score > 0
