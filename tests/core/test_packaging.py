"""The package as installed: the kernels folder imports as ``inferlab.kernels`` (never as a top-level
``kernels``, which is Hugging Face's package and which bitsandbytes and transformers import), from an
editable install and from a built wheel; the grader works from the wheel."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_editable_install_maps_the_kernels_folder(tmp_path):
    """Run outside the repository (``python -m pytest`` puts the working directory on sys.path,
    where the bare folder would import as ``kernels``: that is not what the install provides)."""
    code = ("import importlib.util, json, inferlab.kernels; s = importlib.util.find_spec('kernels'); "
            "print(json.dumps([inferlab.kernels.__file__, s.origin if s else None]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    kernels_file, top_level = json.loads(out.stdout)
    assert Path(kernels_file).resolve() == REPO / "kernels" / "__init__.py"
    assert top_level is None or REPO not in Path(top_level).resolve().parents, \
        f"a top-level `kernels` module must not come from this project: {top_level}"


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out / "dist"), str(REPO)], check=True, capture_output=True, cwd=out)
    wheel = next((out / "dist").glob("inferlab-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    target = out / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    return tops, target


@pytest.mark.slow
def test_wheel_installs_only_the_inferlab_package(wheel_dir):
    tops, target = wheel_dir
    assert {t for t in tops if not t.endswith(".dist-info")} == {"inferlab"}
    code = ("import importlib.util, json, inferlab.kernels; "
            "print(json.dumps([inferlab.kernels.__file__, importlib.util.find_spec('kernels') is None]))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env=env, cwd=target.parent)
    kernels_file, no_top_level = json.loads(out.stdout)
    assert Path(kernels_file).resolve() == (target / "inferlab" / "kernels" / "__init__.py").resolve()
    assert no_top_level


@pytest.mark.slow
def test_grade_runs_from_the_wheel(wheel_dir):
    _, target = wheel_dir
    env = {**os.environ, "PYTHONPATH": str(target), "TQDM_DISABLE": "1"}
    out = subprocess.run([sys.executable, "-m", "inferlab", "grade", str(REPO / "labs" / "00_roofline"),
                          "--reference", "--quiet"], capture_output=True, text=True, env=env, cwd=target.parent)
    assert out.returncode == 0, out.stderr
    assert str(target) in subprocess.run([sys.executable, "-c", "import inferlab; print(inferlab.__file__)"],
                                         capture_output=True, text=True, env=env, cwd=target.parent).stdout
    score, total = out.stdout.strip().split()[-1].split("/")
    assert float(score) == float(total) > 0
