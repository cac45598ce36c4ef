"""Build the course book into book/_build/html, ready to read with no network.

    python -m book.build          (what `make book` runs)

A static site normally pulls mermaid, MathJax and plotly.js from CDNs when it is viewed. This
book serves its own copies instead, taken from registry packages at build time and never
committed:

    plotly.min.js      from the installed plotly wheel (plotly/package_data)
    mermaid.min.js     from the npm package mermaid  (`npm pack`, cached in book/_static_local)
    MathJax 3          from the npm package mathjax (its es5/ build)

Sphinx copies book/_static_local into the site's _static/. The notebooks and the labs' READMEs
live outside book/, so the build mirrors them into book/notebooks and book/labs (generated,
git-ignored) before Sphinx reads them. After the build, every page is scanned: a <script> or
<link> that still points off-site fails the build.
"""
from __future__ import annotations

import filecmp
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BOOK = Path(__file__).resolve().parent
REPO = BOOK.parent
OUT = BOOK / "_build" / "html"
LOCAL = BOOK / "_static_local"  # git-ignored: fetched and copied assets
CACHE = LOCAL / ".npm"  # the npm tarballs, kept between builds
STAMP = OUT / ".inferlab-built"

# npm package, version, and which files of its tarball the site needs
NPM_ASSETS = {
    "mermaid": ("11.12.1", lambda name: name == "package/dist/mermaid.min.js"),
    "mathjax": ("3.2.2", lambda name: name.startswith("package/es5/") and (
        name == "package/es5/tex-mml-chtml.js"
        or name.split("/")[2] in {"input", "output", "a11y", "ui", "adaptors", "sre"})),
}


class BuildError(RuntimeError):
    pass


# ---------------------------------------------------------------- assets

def plotly_js() -> Path:
    """plotly.min.js from the installed plotly package (the version the notebooks used)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise BuildError(f"{path} is missing: reinstall plotly (`make setup`)")
    return path


def npm_tarball(name: str, version: str) -> Path:
    """The package tarball from the npm registry, downloaded once into book/_static_local/.npm."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"{name}-{version}.tgz"
    if tarball.exists():
        return tarball
    npm = shutil.which("npm")
    if npm is None:
        raise BuildError(f"the book serves {name} {version} from its npm package, and npm is not "
                         "installed: install Node.js (`apt-get install npm`), then rerun")
    proc = subprocess.run([npm, "pack", f"{name}@{version}", "--pack-destination", str(CACHE), "--silent"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not tarball.exists():
        raise BuildError(f"`npm pack {name}@{version}` failed (is the npm registry reachable?):\n"
                         f"{proc.stderr.strip()[-2000:]}")
    return tarball


def unpack(name: str, version: str, wanted) -> Path:
    """Extract the wanted files of ``name@version`` into _static_local/<name>/ (once)."""
    dest = LOCAL / name
    marker = dest / ".version"
    if marker.exists() and marker.read_text() == version:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    prefix = "package/es5/" if name == "mathjax" else "package/dist/"
    with tarfile.open(npm_tarball(name, version)) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not wanted(member.name):
                continue
            target = dest / member.name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    marker.write_text(version)
    return dest


def prepare_assets() -> None:
    LOCAL.mkdir(exist_ok=True)
    src = plotly_js()
    dst = LOCAL / "plotly.min.js"
    if not dst.exists() or not filecmp.cmp(src, dst, shallow=False):
        shutil.copy2(src, dst)
    for name, (version, wanted) in NPM_ASSETS.items():
        unpack(name, version, wanted)


# ---------------------------------------------------------------- sources that live outside book/

def _mirror(src: Path, dst: Path) -> None:
    """Copy only when the content changed, so Sphinx rebuilds only what changed."""
    if not dst.exists() or not filecmp.cmp(src, dst, shallow=False):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def sync_sources() -> None:
    """Mirror notebooks/*.ipynb into book/notebooks and write one page per lab in book/labs."""
    notebooks = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
    keep = set()
    for nb in notebooks:
        _mirror(nb, BOOK / "notebooks" / nb.name)
        keep.add(BOOK / "notebooks" / nb.name)
    for stale in (BOOK / "notebooks").glob("*.ipynb"):
        if stale not in keep:
            stale.unlink()

    labs = sorted(p for p in (REPO / "labs").iterdir()
                  if p.is_dir() and (p / "README.md").exists() and not p.name.startswith((".", "_")))
    pages = set()
    for lab in labs:
        # labs/NN/README.md in the book, so notebook links like ../labs/00_roofline/README.md work
        page = BOOK / "labs" / lab.name / "README.md"
        text = (f"```{{include}} ../../../labs/{lab.name}/README.md\n```\n\n"
                f"## The starter\n\n`labs/{lab.name}/starter.py`, the file you edit:\n\n"
                f"```{{literalinclude}} ../../../labs/{lab.name}/starter.py\n:language: python\n```\n")
        if not page.exists() or page.read_text() != text:
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(text)
        pages.add(page)
    for stale in (BOOK / "labs").glob("*/README.md"):
        if stale not in pages:
            shutil.rmtree(stale.parent)


def prepare() -> None:
    """Everything Sphinx needs before it reads the sources (conf.py calls this too)."""
    prepare_assets()
    sync_sources()


# ---------------------------------------------------------------- the offline check

_OFFSITE = re.compile(r"""<(script|link|img|iframe)\b[^>]*?\b(src|href)\s*=\s*["'](https?:)?//""", re.I)


def offsite_references(root: Path = OUT) -> list[str]:
    """Every <script>, <link>, <img> or <iframe> in the built site that loads from another host."""
    found = []
    for page in sorted(root.rglob("*.html")):
        text = page.read_text(errors="replace")
        for m in _OFFSITE.finditer(text):
            tag = text[m.start(): m.start() + 200].split(">")[0]
            found.append(f"{page.relative_to(root)}: {tag}>")
    return found


# ---------------------------------------------------------------- build

def sources() -> list[Path]:
    """The files a build reads: when one is newer than the last build, the site is stale."""
    files = [p for p in BOOK.glob("*.md")] + [BOOK / "conf.py", Path(__file__)]
    files += list(BOOK.glob("_static/*"))
    files += list((REPO / "notebooks").glob("[0-9]*.ipynb"))
    files += list((REPO / "labs").glob("*/README.md")) + list((REPO / "labs").glob("*/starter.py"))
    return [f for f in files if f.exists()]


def is_stale() -> bool:
    if not STAMP.exists():
        return True
    built = STAMP.stat().st_mtime
    return any(f.stat().st_mtime > built for f in sources())


def build(quiet: bool = True) -> Path:
    """Build the site (incrementally) and check it loads nothing from other hosts."""
    from sphinx.cmd.build import build_main

    prepare()
    # Sphinx copies static files only when some page is rebuilt: refresh the ones that changed
    if (OUT / "_static").is_dir():
        for src in (BOOK / "_static").glob("*"):
            _mirror(src, OUT / "_static" / src.name)
    args = ["-b", "html", str(BOOK), str(OUT)] + (["-q"] if quiet else [])
    if build_main(args) != 0:
        raise BuildError("sphinx-build failed (see the messages above)")
    offsite = offsite_references()
    if offsite:
        raise BuildError("the built book still loads from other hosts:\n  " + "\n  ".join(offsite))
    STAMP.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return OUT


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    try:
        out = build()
    except BuildError as exc:
        print(f"book: error: {exc}", file=sys.stderr)
        return 1
    print(f"book: built {out.relative_to(REPO)}/index.html in {time.perf_counter() - t0:.1f} s, "
          "serving plotly.js, mermaid and MathJax locally")
    return 0


if __name__ == "__main__":
    sys.exit(main())
