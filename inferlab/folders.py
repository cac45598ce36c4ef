"""Where inferlab writes: model folders all at once (a crash never leaves half a folder behind),
and the cache of what it builds on first use.

Its own module because both the loader (``save_checkpoint``) and the quantized savers
(``quant/checkpoint.py``) write folders, and the loader also reads quantized ones.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """Where inferlab keeps what it builds on first use (random-weight models, compiled kernels):
    ``~/.cache/inferlab``, or ``INFERLAB_CACHE``."""
    return Path(os.environ.get("INFERLAB_CACHE", Path.home() / ".cache" / "inferlab")).expanduser()


@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike):
    """Yield a temporary sibling of ``folder``; on success it replaces ``folder`` in one rename, on
    any error it is removed, so a crash never leaves a half-written model folder behind."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it owner-only; a model folder is ordinary
        for p in tmp.iterdir():  # and so are its files (safetensors writes 0600)
            if p.is_file():
                p.chmod(0o666 & ~umask)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
