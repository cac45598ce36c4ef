"""``inferlab grade labs/NN_topic [--reference] [--json results.json]``: run a lab's graded tests.

Which ``starter.py`` is graded: the student's copy in ``workspace/`` whenever one exists, from
any working folder: the repository's root, ``workspace/``, a notebook cell under
``workspace/notebooks`` (``!inferlab grade ../labs/02_kv_cache``), or anywhere else. A workspace
is the copy ``make lab`` made (it holds workspace.MANIFEST) or a ``workspace/`` folder with a
``labs/`` inside, made by hand. The copy is graded rather than merely named, because it is the
file the student edits: grading the course's starter instead would score their work 0. When the
typed path named another folder, the report says which one was graded instead. Only an absolute
path, or a relative one that names a folder inside a workspace, is graded exactly as given. The
report starts with the absolute path of the file it graded, and says so in one line when that
file is the course's own untouched starter.

The tests run under pytest in a fresh subprocess (so a student's file is imported clean every
time and cannot crash the grader), with the plugin in :mod:`inferlab.labkit` recording each
test's points. The grader loads that plugin itself and no conftest.py, so a lab folder copied
anywhere grades the same. The result has the shape Gradescope's autograder expects::

    {"score": 4.0, "max_score": 17.0,
     "tests": [{"name": "test_weight_bytes_of_known_models", "score": 2.0, "max_score": 2.0,
                "output": ""}, ...]}

Exit status: 0 when every test passed, 1 when some failed, 2 for a bad lab folder.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from inferlab.errors import InferlabError

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_GLOB = "test_*.py"
TIMEOUT_PER_TEST_S = 120


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferlab grade", description="Grade a lab: labs/NN_topic.")
    p.add_argument("lab", help="the lab folder, e.g. labs/00_roofline (or just 00_roofline)")
    p.add_argument("--reference", action="store_true",
                   help="grade inferlab's own implementation (the reference solution) instead of the starter")
    p.add_argument("--json", metavar="PATH", help="also write Gradescope-style results to PATH")
    p.add_argument("--quiet", action="store_true", help="print only the score line")
    return p


def is_workspace(folder: Path) -> bool:
    """A student's workspace: the copy ``make lab`` made (it holds the manifest), or a folder
    named ``workspace/`` with a ``labs/`` inside, copied there by hand."""
    from inferlab.viz.workspace import MANIFEST, WORKSPACE

    return (folder / MANIFEST).is_file() or (folder.name == WORKSPACE and (folder / "labs").is_dir())


def find_workspace(cwd: Path) -> Path | None:
    """The workspace that holds ``cwd`` or sits in one of its folders (the repository's root
    holds ``workspace/``), else the course's own ``workspace/``, else None."""
    from inferlab.viz.workspace import WORKSPACE

    for folder in (cwd, *cwd.parents):
        for candidate in (folder, folder / WORKSPACE):
            if is_workspace(candidate):
                return candidate
    own = REPO_ROOT / WORKSPACE
    return own if is_workspace(own) else None


def resolve_lab(arg: str | os.PathLike, cwd: str | os.PathLike | None = None) -> Path:
    """The lab folder a student means by ``arg`` typed in ``cwd``: their workspace copy whenever
    one exists (see the module docstring), else the folder itself, else the course's labs/NAME."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    path = Path(arg).expanduser()
    if path.is_absolute():
        return find_lab(path)
    here = (cwd / path).resolve()
    workspace = find_workspace(cwd)
    if here.is_dir() and workspace is not None and here.is_relative_to(workspace.resolve()):
        return find_lab(here)
    if workspace is not None and (workspace / "labs" / path.name).is_dir():
        return find_lab(workspace / "labs" / path.name)
    return find_lab(here if here.is_dir() else path)


def redirect_note(arg: str | os.PathLike, cwd: str | os.PathLike | None, lab: Path) -> str | None:
    """One line when ``arg`` typed in ``cwd`` names a folder other than ``lab``, the one graded."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    typed = (cwd / Path(arg).expanduser()).resolve()
    if not typed.is_dir() or typed == lab.resolve():
        return None
    return (f"note: graded your workspace copy, not {typed} (give that folder's absolute path "
            "to grade it instead)")


def starter_note(lab: Path) -> str | None:
    """One line when ``lab``'s starter.py is the course's own, as the course shipped it."""
    starter = lab / "starter.py"
    course = REPO_ROOT / "labs" / lab.name / "starter.py"
    if starter.resolve() != course.resolve():
        if course.is_file() and starter.is_file() and starter.read_bytes() == course.read_bytes():
            return "note: your copy is still the course's untouched starter: write your code in it, then grade again"
        return None
    try:
        shipped = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"HEAD:labs/{lab.name}/starter.py"],
                                 capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if shipped.returncode == 0 and shipped.stdout == starter.read_bytes():
        return ("note: this is the course's own untouched starter (no workspace copy found): `make lab` "
                f"makes your copy, workspace/labs/{lab.name}/starter.py")
    return None


def find_lab(arg: str | os.PathLike) -> Path:
    """The lab folder for ``arg``: a path, or a lab name looked up in the repository's labs/."""
    path = Path(arg).expanduser()
    candidates = [path]
    if not path.is_absolute():
        candidates.append(REPO_ROOT / "labs" / path.name)
    for candidate in candidates:
        if candidate.is_dir():
            lab = candidate.resolve()
            if not list(lab.glob(TEST_GLOB)):
                raise InferlabError(f"{arg}: no graded tests ({TEST_GLOB}) in {lab}; is this a lab folder?")
            return lab
    known = ", ".join(str(p.relative_to(REPO_ROOT)) for p in list_labs()) or "none found"
    raise InferlabError(f"no lab folder {str(arg)!r}; labs are folders like labs/00_roofline "
                        f"(available: {known})")


def list_labs(root: Path | None = None) -> list[Path]:
    """Every lab folder under ``root`` (default: the repository's labs/), in course order."""
    root = REPO_ROOT / "labs" if root is None else Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")) and list(p.glob(TEST_GLOB)))


def _pytest_command(lab: Path, reference: bool, raw_json: Path) -> list[str]:
    # The grading plugin comes from the package and no conftest.py is read: a lab folder grades
    # the same wherever it was copied, with or without labs/conftest.py beside it.
    cmd = [sys.executable, "-m", "pytest", str(lab), "-q", "-p", "no:cacheprovider",
           "-p", "inferlab.labkit", "--noconftest",
           "-o", "addopts=", "--grade-json", str(raw_json), "--color=no", "-rN"]
    try:
        import pytest_timeout  # noqa: F401
        cmd += ["-p", "pytest_timeout", f"--timeout={TIMEOUT_PER_TEST_S}"]  # an endless loop fails, not hangs
    except ImportError:
        pass
    if reference:
        cmd.append("--reference")
    return cmd


def run_lab(lab: str | os.PathLike, reference: bool = False) -> dict:
    """Grade one lab and return the Gradescope-style results dict (plus "lab" and "mode")."""
    lab_dir = find_lab(lab)
    with tempfile.TemporaryDirectory(prefix="inferlab-grade-") as tmp:
        raw_json = Path(tmp) / "raw.json"
        # Only the plugins grading needs: loading every installed pytest plugin (nbval, jupyter,
        # playwright...) would double the time a student waits for a grade.
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "TQDM_DISABLE": "1",
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        env.pop("INFERLAB_LAB_IMPL", None)
        proc = subprocess.run(_pytest_command(lab_dir, reference, raw_json), cwd=tmp, env=env,
                              capture_output=True, text=True)
        if not raw_json.exists():
            tail = (proc.stdout + proc.stderr).strip()[-3000:]
            raise InferlabError(f"the tests of {lab_dir} did not run (pytest exit {proc.returncode}). "
                                f"pytest said:\n{tail}")
        raw = json.loads(raw_json.read_text())
    tests = []
    for entry in raw["tests"]:
        name = entry["nodeid"].split("::", 1)[-1] if "::" in entry["nodeid"] else entry["nodeid"]
        max_score = float(entry["max_score"])
        tests.append({"name": name, "score": max_score if entry["passed"] else 0.0,
                      "max_score": max_score, "output": entry["output"]})
    return {
        "score": sum(t["score"] for t in tests),
        "max_score": sum(t["max_score"] for t in tests),
        "tests": tests,
        "lab": lab_dir.name,
        "mode": "reference" if reference else "starter",
        "path": str(lab_dir / "starter.py"),
        "note": None if reference else starter_note(lab_dir),
    }


def format_summary(results: dict, quiet: bool = False) -> str:
    """The report a student reads: one line per test, the reason under each failure.

    When starter.py does not load, its error is printed once, above the tests, not under each.
    """
    lines = []
    if not quiet:
        from inferlab.labkit import SEE_LOAD_ERROR

        if results["mode"] == "reference":
            lines.append(f"lab {results['lab']}: grading inferlab's reference implementation")
        else:
            lines.append(f"lab {results['lab']}: grading {results.get('path', 'starter.py')}")
        if results.get("note"):
            lines.append(results["note"])
        tests = results["tests"]
        load_error = any(t["output"] == SEE_LOAD_ERROR for t in tests)
        if load_error:  # the first test carries the error itself; show it once, at the top
            first = next(t for t in tests if t["output"] and t["output"] != SEE_LOAD_ERROR)
            lines += ["  " + line for line in first["output"].splitlines()]
        width = max((len(t["name"]) for t in tests), default=10)
        for t in tests:
            mark = "PASS" if t["score"] == t["max_score"] and t["max_score"] > 0 else "FAIL"
            lines.append(f"  {mark}  {t['name']:<{width}}  {_num(t['score'])}/{_num(t['max_score'])}")
            if mark == "FAIL" and t["output"] and not load_error:
                lines += ["        " + line for line in t["output"].splitlines()]
    lines.append(f"score: {_num(results['score'])}/{_num(results['max_score'])}")
    return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:g}"


def gradescope_json(results: dict) -> dict:
    """Only the keys Gradescope reads (the summary keeps "lab" and "mode" too)."""
    keys = ("name", "score", "max_score", "output")
    return {"score": results["score"], "max_score": results["max_score"],
            "tests": [{k: t[k] for k in keys} for t in results["tests"]]}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    lab = resolve_lab(args.lab)
    results = run_lab(lab, reference=args.reference)
    notes = [n for n in (redirect_note(args.lab, None, lab), results["note"]) if n]
    results["note"] = "\n".join(notes) or None
    print(format_summary(results, quiet=args.quiet))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(gradescope_json(results), indent=2) + "\n")
        except OSError as exc:
            raise InferlabError(f"cannot write {args.json}: {exc.strerror}") from exc
    full = results["max_score"] > 0 and results["score"] == results["max_score"]
    return 0 if full else 1
