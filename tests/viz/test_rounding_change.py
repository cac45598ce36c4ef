"""The notebooks' stored outputs hold on any CPU: proof that the check can fail, and that it does
fail on what it must catch.

`make test` runs nbval a second time under ``ROUNDING_CHANGE`` (read from the Makefile here, so
the test and CI use one definition). That pass proves something only if those settings change
the raw floats the notebooks compute; the first test shows they do, on the embedded model's
logits. The second shows what nbval still compares once figure data is left out: a figure whose
numbers moved in their low bits passes, a figure whose structure changed fails.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import hashlib, json, torch
from inferlab import LLM
llm = LLM(model="target")
ids = torch.tensor([llm.tokenizer.encode("def fibonacci(n):\\n    if n < 2:\\n        return n")])
with torch.no_grad():
    logits = llm.model(ids)
logits = (logits[0] if isinstance(logits, tuple) else logits).float()
print(json.dumps({"sha": hashlib.sha1(logits.numpy().tobytes()).hexdigest(), "head": logits.flatten()[:64].tolist()}))
"""


def rounding_change_env() -> dict[str, str]:
    line = next(l for l in (ROOT / "Makefile").read_text().splitlines() if l.startswith("ROUNDING_CHANGE"))
    return dict(pair.split("=", 1) for pair in line.split(":=", 1)[1].split())


def _probe(extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in rounding_change_env()}
    env.update(extra, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_rounding_change_settings_change_raw_floats():
    import torch

    settings = rounding_change_env()
    assert {"ATEN_CPU_CAPABILITY", "MKL_CBWR"} <= set(settings)
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT" and not torch.backends.mkl.is_available():
        pytest.skip("this CPU already runs ATen's portable kernels without MKL: nothing to change here")
    normal, changed = _probe({}), _probe(settings)
    assert normal["sha"] != changed["sha"], (
        f"{settings} leave the model's logits bit-identical on this machine: the second nbval pass "
        "in `make test` would prove nothing; find settings that change float rounding here")
    assert normal["head"] == pytest.approx(changed["head"], rel=1e-4, abs=1e-4)  # noise, not a bug


def _figure_notebook(path: Path, fig) -> None:
    """A one-cell notebook whose stored output is exactly what the kernel would emit for ``fig``."""
    import nbformat

    from inferlab import viz

    source = ("import plotly.graph_objects as go\nfrom inferlab import viz\n"
              "viz.show(go.Figure(go.Bar(x=['a', 'b'], y=[0.1 + 0.2, 1 / 3], name='share'),"
              " layout=dict(title='t', yaxis_title='y')))")
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    cell.outputs = [nbformat.v4.new_output("execute_result", data=viz.show(fig)._repr_mimebundle_(),
                                           execution_count=1)]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _nbval(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
                           "--nbval-current-env", "--nbval-sanitize-with", str(ROOT / "notebooks/nbval_sanitize.cfg"),
                           str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_nbval_ignores_figure_noise_and_catches_structure(tmp_path):
    pytest.importorskip("nbval")
    import plotly.graph_objects as go

    shutil.copy(ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")  # the notebooks' own plugin
    noisy = go.Figure(go.Bar(x=["a", "b"], y=[0.30000000000000004 + 2e-16, 0.3333333333333333 - 5e-17], name="share"),
                      layout=dict(title="t", yaxis_title="y"))
    _figure_notebook(tmp_path / "fig.ipynb", noisy)
    stored = json.loads((tmp_path / "fig.ipynb").read_text())["cells"][0]["outputs"][0]["data"]
    assert stored["application/vnd.plotly.v1+json"]["data"][0]["y"] != [0.1 + 0.2, 1 / 3]
    ok = _nbval(tmp_path)
    assert ok.returncode == 0, ok.stdout[-3000:]  # low bits of the data moved: passes

    (tmp_path / "conftest.py").unlink()  # without the plugin, the same noise fails the comparison
    assert _nbval(tmp_path).returncode != 0
    shutil.copy(ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")

    renamed = go.Figure(go.Bar(x=["a", "b"], y=[0.1 + 0.2, 1 / 3], name="shares"), layout=dict(title="t", yaxis_title="y"))
    _figure_notebook(tmp_path / "fig.ipynb", renamed)
    bad = _nbval(tmp_path)
    assert bad.returncode != 0 and "share" in bad.stdout  # a trace's name changed: fails
