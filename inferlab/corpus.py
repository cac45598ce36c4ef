"""The training corpus: the running interpreter's standard library, read where it is installed.

Every Python installation carries a few megabytes of carefully written source code, so the
course can train its models without downloading anything and without copying that source into
the repository. Test files are left out (they are long, repetitive and full of fixtures).

The split is by *file* and fixed by a hash of the file's relative path, so a file is in the same
split on every machine and adding or removing files never moves the others:

    bucket = sha256(relative path) mod 100:   0-89 train,  90-94 validation,  95-99 test
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys
import sysconfig
from pathlib import Path

SPLITS = ("train", "validation", "test")
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclasses.dataclass(frozen=True)
class SourceFile:
    relpath: str  # posix path relative to the standard library root
    text: str

    @property
    def split(self) -> str:
        return split_of(self.relpath)


def stdlib_root() -> Path:
    """Folder of the running interpreter's standard library (e.g. .../lib/python3.11)."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """The split a file belongs to, decided by a hash of its relative path only."""
    bucket = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


def is_test_file(relpath: str) -> bool:
    parts = relpath.split("/")
    name = parts[-1]
    return (any(p in _EXCLUDED_DIRS for p in parts[:-1])
            or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py")


def list_files(root: Path | None = None) -> list[str]:
    """Relative paths of the non-test ``.py`` files, sorted so the order never depends on the disk."""
    root = root or stdlib_root()
    rels = (p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file())
    return sorted(r for r in rels if not is_test_file(r))


def load_corpus(split: str | None = None, root: Path | None = None,
                max_files: int | None = None) -> list[SourceFile]:
    """Read the corpus (one split, or all files when ``split`` is None) in sorted-path order.

    ``max_files`` keeps only the first N files of each split (for quick smoke runs).
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    root = root or stdlib_root()
    out: list[SourceFile] = []
    taken = dict.fromkeys(SPLITS, 0)
    for rel in list_files(root):
        s = split_of(rel)
        if (split is not None and s != split) or (max_files is not None and taken[s] >= max_files):
            continue
        text = (root / rel).read_bytes().decode("utf-8", errors="replace")
        if text.strip():
            out.append(SourceFile(rel, text))
            taken[s] += 1
    return out


def fingerprint(files: list[SourceFile]) -> str:
    """A short hash of the corpus content: two machines with equal fingerprints train on equal data."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.relpath.encode() + b"\0" + f.text.encode() + b"\0")
    return h.hexdigest()[:12]


def describe() -> str:
    """One line saying which interpreter the corpus comes from."""
    v = sys.version_info
    return f"The Python {v.major}.{v.minor}.{v.micro} standard library"


def token_stream(tokenizer, files: list[SourceFile]):
    """Token ids of ``files`` as one int64 numpy stream, each file preceded by ``<|endoftext|>``:
    the layout the models were trained on and are scored on."""
    import numpy as np

    from inferlab.model.tokenizer import EOT

    eot = tokenizer.hf.token_to_id(EOT)
    parts = []
    for enc in tokenizer.hf.encode_batch([f.text for f in files], add_special_tokens=False):
        parts += ([[eot]] if eot is not None else []) + [enc.ids]
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if parts else np.zeros(0, np.int64)
