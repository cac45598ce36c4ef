"""The workspace `make lab` serves: a student runs notebooks and edits starters there, the course
changes upstream, and `git pull` plus the next `make lab` neither conflict nor lose the edits."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.viz import workspace as ws

REPO = Path(__file__).resolve().parents[2]
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "course", "GIT_AUTHOR_EMAIL": "course@example.org",
           "GIT_COMMITTER_NAME": "course", "GIT_COMMITTER_EMAIL": "course@example.org",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(cwd, *args) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def notebook(*sources: str) -> str:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": src} for i, src in enumerate(sources)]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def run_like_jupyterlab(path: Path) -> None:
    """Execute a notebook in its folder and save it back, outputs and all, as JupyterLab does."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)


@pytest.fixture
def course(tmp_path):
    """An upstream course repository and a student's clone of it (with the repo's .gitignore)."""
    upstream = tmp_path / "upstream"
    (upstream / "notebooks").mkdir(parents=True)
    (upstream / "labs" / "00_demo").mkdir(parents=True)
    shutil.copy(REPO / ".gitignore", upstream / ".gitignore")
    (upstream / "notebooks" / "00_demo.ipynb").write_text(notebook("x = 6 * 7\nprint(x)"))
    (upstream / "labs" / "00_demo" / "starter.py").write_text("def answer():\n    raise NotImplementedError\n")
    (upstream / "labs" / "00_demo" / "README.md").write_text("# Lab 00\n")
    git(upstream, "init", "-q", "-b", "main")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "course v1")
    student = tmp_path / "student"
    git(tmp_path, "clone", "-q", str(upstream), str(student))
    return upstream, student


def test_running_and_editing_in_the_workspace_never_blocks_git_pull(course):
    upstream, student = course
    report = ws.sync(student)
    assert sorted(report.created) == ["labs/00_demo/README.md", "labs/00_demo/starter.py", "notebooks/00_demo.ipynb"]
    work = student / ws.WORKSPACE
    run_like_jupyterlab(work / "notebooks" / "00_demo.ipynb")
    (work / "labs" / "00_demo" / "starter.py").write_text("def answer():\n    return 42\n")
    saved = json.loads((work / "notebooks" / "00_demo.ipynb").read_text())
    assert "".join(saved["cells"][0]["outputs"][0]["text"]) == "42\n"  # the run was saved, in the workspace
    assert git(student, "status", "--porcelain") == ""  # nothing tracked changed, nothing untracked shown

    # The course moves on: every file changes upstream.
    (upstream / "notebooks" / "00_demo.ipynb").write_text(notebook("x = 6 * 7\nprint(x, 'v2')"))
    (upstream / "labs" / "00_demo" / "starter.py").write_text("def answer():\n    raise NotImplementedError('v2')\n")
    (upstream / "labs" / "00_demo" / "README.md").write_text("# Lab 00, v2\n")
    git(upstream, "commit", "-q", "-am", "course v2")
    git(student, "pull", "-q", "--ff-only")  # fails on any local change to a tracked file

    again = ws.sync(student)
    # only run, never edited: replaced by the new version; edited: kept, the new one beside it
    assert sorted(again.updated) == ["labs/00_demo/README.md", "notebooks/00_demo.ipynb"]
    assert again.kept == ["labs/00_demo/starter.py"]
    assert "print(x, 'v2')" in (work / "notebooks" / "00_demo.ipynb").read_text()
    assert "return 42" in (work / "labs" / "00_demo" / "starter.py").read_text()
    assert "v2" in (work / "labs" / "00_demo" / "starter.upstream.py").read_text()
    assert any("kept your edited labs/00_demo/starter.py" in line for line in again.lines())
    assert git(student, "status", "--porcelain") == ""

    # Once merged by hand, the student's file is the course's: the side copy goes away.
    shutil.copy(upstream / "labs" / "00_demo" / "starter.py", work / "labs" / "00_demo" / "starter.py")
    assert ws.sync(student).kept == []
    assert not (work / "labs" / "00_demo" / "starter.upstream.py").exists()


def test_a_run_notebook_is_not_an_edit_and_a_quiet_sync_changes_nothing(course):
    _, student = course
    ws.sync(student)
    path = student / ws.WORKSPACE / "notebooks" / "00_demo.ipynb"
    run_like_jupyterlab(path)
    before = path.read_bytes()
    report = ws.sync(student)
    assert report.created == report.updated == report.kept == []
    assert path.read_bytes() == before  # outputs of the student's run are kept
    assert ws.content_key(path) == ws.content_key(student / "notebooks" / "00_demo.ipynb")


def test_a_deleted_file_comes_back_and_a_wrong_folder_is_explained(course, tmp_path):
    _, student = course
    ws.sync(student)
    (student / ws.WORKSPACE / "labs" / "00_demo" / "starter.py").unlink()
    assert ws.sync(student).created == ["labs/00_demo/starter.py"]
    with pytest.raises(FileNotFoundError, match="run this from the course's folder"):
        ws.sync(tmp_path / "nowhere")
    proc = subprocess.run([sys.executable, "-m", "inferlab.viz.workspace", "sync", "--source", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1


def test_lab_command_serves_the_workspace_with_inferlab_on_path(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_b.ipynb").write_text(notebook())
    (tmp_path / "notebooks" / "00_a.ipynb").write_text(notebook())
    cmd = ws.lab_command(tmp_path)
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in cmd
    assert "--LabApp.default_url=/lab/tree/notebooks/00_a.ipynb" in cmd
    env = ws.lab_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert (Path(sys.executable).parent / "inferlab").exists()
    overrides = json.loads((ws.JUPYTER_CONFIG / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
