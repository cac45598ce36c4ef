"""``make mutants``: plant plausible one-line bugs, one at a time, and check the tests catch each one.

Each entry of ``scripts/mutants.toml`` names a file, the text to find there (exactly once), what
to put instead, and the test files (or test ids) that must fail with the bug in place. For each
bug this script changes one file in a scratch copy of the tree (hard links, so the copy is cheap),
runs ``pytest -x`` on those tests, and restores the file. A bug is *killed* when pytest reports a
failing test (exit code 1) or the tests time out; it *survived* when they all pass. Anything else
(the text to find is missing, a collection error) is an error: the list no longer matches the code.

    python scripts/mutants.py                    # every bug, two at a time
    python scripts/mutants.py --only int8-scale-255 -j 1
    python scripts/mutants.py --list             # what would run

Exit status 0 only when every bug is killed. Bugs marked ``pending`` name tests that another branch
brings: they are listed but not run (``--pending`` runs them too, without failing on them) until
that mark is removed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip carries the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LIST = Path(__file__).with_name("mutants.toml")


def load(path: Path) -> list[dict]:
    mutants = tomllib.loads(path.read_text())["mutant"]
    names = [m["name"] for m in mutants]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: mutant names must be unique")
    for m in mutants:
        m.setdefault("edits", [[m.pop("find"), m.pop("replace")]] if "find" in m else [])
        if not m["edits"] or not m.get("tests"):
            raise SystemExit(f"{path}: mutant {m['name']!r} needs find/replace (or edits) and tests")
    return mutants


def apply(text: str, edits: list[list[str]]) -> str:
    """The text with every (find, replace) edit made; each find must occur exactly once."""
    for find, replace in edits:
        count = text.count(find)
        if count != 1:
            raise LookupError(f"{find.strip()[:60]!r} occurs {count} times (want exactly 1)")
        text = text.replace(find, replace)
    return text


def scratch_tree() -> Path:
    """A copy of the tracked and untracked-but-not-ignored files, hard-linked where possible."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    dest = Path(tempfile.mkdtemp(prefix="inferlab-mutants-"))
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest / rel)
        except OSError:  # another file system: copy
            shutil.copy2(src, dest / rel)
    # kernels/ installs as inferlab.kernels (setup.py's package_dir). An editable install elsewhere
    # would answer that import with its own copy; a link inside the scratch inferlab/ answers first.
    if (dest / "kernels").is_dir() and not (dest / "inferlab" / "kernels").exists():
        (dest / "inferlab" / "kernels").symlink_to("../kernels", target_is_directory=True)
    return dest


def run_one(m: dict, tree: Path, timeout: float) -> dict:
    path = tree / m["file"]
    original = path.read_bytes()
    t0 = time.perf_counter()
    try:
        mutated = apply(original.decode(), m["edits"])
    except LookupError as exc:
        return {**m, "result": "error", "detail": f"{m['file']}: {exc}", "seconds": 0.0}
    missing = [t for t in m["tests"] if not (tree / t.split("::")[0]).exists()]
    if missing:
        return {**m, "result": "error", "detail": f"no such test file: {', '.join(missing)}", "seconds": 0.0}
    path.unlink()  # a hard link: write a new file, never through the link into the real tree
    path.write_text(mutated)
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not browser",
           *m.get("pytest_args", []), *m["tests"]]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        code, tail = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        result = {0: "SURVIVED", 1: "killed"}.get(code, "error")
        detail = tail[0]
    except subprocess.TimeoutExpired:
        result, detail = "killed", f"tests timed out after {timeout:.0f} s"
    finally:
        path.unlink()
        path.write_bytes(original)
    return {**m, "result": result, "detail": detail, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/mutants.py", description=__doc__.split("\n")[0])
    p.add_argument("--file", type=Path, default=LIST, help=f"the list of bugs (default: {LIST.relative_to(ROOT)})")
    p.add_argument("--only", nargs="+", default=None, help="run only these mutants (by name)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once, each in its own tree (default: 2)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per mutant's tests (default: 300)")
    p.add_argument("--list", action="store_true", help="print the bugs and their tests, run nothing")
    p.add_argument("--pending", action="store_true", help="also run the bugs marked pending (their survival "
                   "is reported, not failed)")
    args = p.parse_args(argv)
    mutants = load(args.file)
    if args.only:
        unknown = set(args.only) - {m["name"] for m in mutants}
        if unknown:
            p.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m["name"] in args.only]
    if args.list:
        for m in mutants:
            print(f"{m['name']:<28} {m['file']:<34} {' '.join(m['tests'])}" + (" (pending)" if m.get("pending") else ""))
        return 0
    skipped = [m for m in mutants if m.get("pending") and not args.pending and not args.only]
    for m in skipped:
        print(f"{'pending, not run':<20} {m['name']:<28} {'':>8}  {m['pending']}")
    mutants = [m for m in mutants if m not in skipped]
    jobs = max(1, min(args.jobs, len(mutants)))
    trees = [scratch_tree() for _ in range(jobs)]
    free = list(trees)
    results = []
    t0 = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            def task(m):
                tree = free.pop()
                try:
                    return run_one(m, tree, args.timeout)
                finally:
                    free.append(tree)

            for r in pool.map(task, mutants):
                mark = " (pending)" if r.get("pending") and r["result"] == "SURVIVED" else ""
                print(f"{r['result'] + mark:<20} {r['name']:<28} {r['seconds']:6.1f} s  {r['detail']}", flush=True)
                results.append(r)
    finally:
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
    bad = [r for r in results if r["result"] == "error" or (r["result"] == "SURVIVED" and not r.get("pending"))]
    pending = [r for r in results if r["result"] == "SURVIVED" and r.get("pending")]
    killed = sum(r["result"] == "killed" for r in results)
    print(f"\n{killed} of {len(results)} bugs killed in {time.perf_counter() - t0:.0f} s"
          + (f"; {len(pending) + len(skipped)} pending: {', '.join(m['name'] for m in pending + skipped)}"
             if pending or skipped else ""))
    for r in bad:
        print(f"{r['result']}: {r['name']} ({r['file']}): {r['why']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
