"""The student's workspace: a git-ignored copy of notebooks/ and labs/ that JupyterLab opens.

Running a notebook rewrites it (outputs, execution counts, widget ids) and a lab asks you to edit
its starter.py. Done on the tracked files, both would make the next ``git pull`` of the course
conflict. So ``make lab`` serves ``workspace/`` instead, a copy made on the first start and
refreshed on every later one (``python -m inferlab.viz.workspace sync`` does only the refresh):

- a file you have not changed is replaced by the course's newer version;
- a file you changed is kept, and the course's newer version is written beside it as
  ``NAME.upstream.EXT`` (``starter.upstream.py``) for you to compare and merge;
- a file you deleted comes back as the course's version (delete it to start over), and its
  ``NAME.upstream.EXT`` goes;
- a notebook counts as changed only when the source of a cell changed: running it does not.

The tracked files stay exactly as ``git pull`` left them. ``workspace/.inferlab-workspace.json``
records what each copy was made from.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

FOLDERS = ("notebooks", "labs")
WORKSPACE = "workspace"
MANIFEST = ".inferlab-workspace.json"
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".hypothesis", ".pytest_cache"}
UPSTREAM_TAG = ".upstream"
#: Lab settings for the course (no news prompt, README links open rendered): JupyterLab reads
#: labconfig/default_setting_overrides.json from every folder on JUPYTER_CONFIG_PATH.
JUPYTER_CONFIG = Path(__file__).resolve().parent / "jupyter_config"


def content_key(path: Path) -> str:
    """What counts as the student's edit: a notebook's cell sources, any other file's bytes."""
    data = path.read_bytes()
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(data).get("cells", [])
            data = json.dumps([(c.get("cell_type"), "".join(c.get("source", ""))) for c in cells]).encode()
        except (ValueError, AttributeError):
            pass  # not valid JSON: compare the bytes
    return hashlib.sha256(data).hexdigest()


def upstream_name(rel: str) -> str:
    """``labs/00/starter.py`` -> ``labs/00/starter.upstream.py`` (still opens with the right editor)."""
    p = Path(rel)
    return str(p.with_name(p.stem + UPSTREAM_TAG + p.suffix))


@dataclasses.dataclass
class SyncReport:
    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)  # yours, with NAME.upstream.EXT beside

    def lines(self) -> list[str]:
        out = []
        if self.created:
            n = len(self.created)
            out.append(f"workspace: copied {n} course file{'' if n == 1 else 's'}")
        if self.updated:
            out.append("workspace: updated to the course's new version: " + ", ".join(self.updated))
        for rel in self.kept:
            out.append(f"workspace: kept your edited {rel}; the course's new version is {upstream_name(rel)}")
        return out


def course_files(source: Path, folders=FOLDERS) -> list[str]:
    """Every file of the course folders, relative to ``source`` (caches and copies left out)."""
    found = []
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(source / folder):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith((".pyc", ".log")) or UPSTREAM_TAG + "." in name:
                    continue
                found.append((Path(dirpath) / name).relative_to(source).as_posix())
    return found


def sync(source: str | os.PathLike = ".", dest: str | os.PathLike | None = None, folders=FOLDERS) -> SyncReport:
    """Create or refresh the workspace ``dest`` (default ``source/workspace``) from ``source``."""
    source = Path(source).resolve()
    missing = [f for f in folders if not (source / f).is_dir()]
    if missing:
        raise FileNotFoundError(f"{source} has no {', '.join(missing)}/: run this from the course's "
                                "folder (where the Makefile is)")
    dest = Path(dest) if dest is not None else source / WORKSPACE
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    report = SyncReport()
    for rel in course_files(source, folders):
        src, dst = source / rel, dest / rel
        new_key, recorded = content_key(src), manifest.get(rel)
        if not dst.exists():  # first run, or deleted to start over: a fresh copy, no stale upstream beside it
            _copy(src, dst)
            (dest / upstream_name(rel)).unlink(missing_ok=True)
            report.created.append(rel)
        elif new_key == recorded:
            continue  # the course has not changed this file since it was copied
        elif content_key(dst) == new_key:  # already the course's version (outputs may differ)
            (dest / upstream_name(rel)).unlink(missing_ok=True)  # merged by hand: the copy is done
        elif content_key(dst) == recorded:  # not edited here: take the course's new version
            _copy(src, dst)
            report.updated.append(rel)
        else:  # edited here and changed in the course: keep both, never overwrite the student
            _copy(src, dest / upstream_name(rel))
            report.kept.append(rel)
            continue  # keep the old key: this file still differs from what the course sent
        manifest[rel] = new_key
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return report


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def first_notebook(workspace: Path) -> str:
    notebooks = sorted((workspace / "notebooks").glob("[0-9]*.ipynb"))
    return notebooks[0].relative_to(workspace).as_posix() if notebooks else ""


def lab_command(workspace: str | os.PathLike, *extra: str) -> list[str]:
    """JupyterLab serving ``workspace`` (notebooks/ and labs/ side by side), the first notebook open.

    Run it from inside ``workspace``: JupyterLab's terminals start in the server's own folder."""
    workspace = Path(workspace).resolve()
    # Terminals run the user's shell as it is, not a login shell (JupyterLab's choice when it has
    # no tty), whose /etc/profile would drop this Python's scripts, and `inferlab`, from the PATH.
    shell = os.environ.get("SHELL") or shutil.which("bash") or "/bin/sh"
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}",
           f"--LabApp.default_url=/lab/tree/{first_notebook(workspace)}",
           "--ServerApp.terminado_settings=" + json.dumps({"shell_command": [shell]}),
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # JupyterLab refuses to run as root otherwise (containers)
    return cmd + list(extra)


def lab_env(env: dict | None = None) -> dict:
    """The environment JupyterLab, its kernels and its terminals run in: this Python's scripts
    (``inferlab``) first on PATH, and the course's lab settings on JUPYTER_CONFIG_PATH."""
    env = dict(os.environ if env is None else env)
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != scripts]])
    paths = [p for p in env.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p]
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(JUPYTER_CONFIG), *paths])
    return env


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m inferlab.viz.workspace", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["sync", "lab"], help="sync: refresh workspace/; lab: sync, then open JupyterLab")
    p.add_argument("--source", default=".", help="the course folder (default: the current folder)")
    p.add_argument("--dest", default=None, help="the workspace (default: SOURCE/workspace)")
    args, extra = p.parse_known_args(argv)
    if extra and args.command != "lab":
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        report = sync(args.source, args.dest)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    if args.command == "lab":
        dest = Path(args.dest) if args.dest else Path(args.source) / WORKSPACE
        cmd = lab_command(dest, *extra)
        os.chdir(dest)  # terminals open in the server's folder: the workspace, beside labs/
        os.execvpe(cmd[0], cmd, lab_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
