"""The labs prove themselves: for every lab folder, each graded test fails on the untouched
starter (a test that passes there grades nothing) and passes on inferlab's reference."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inferlab import cli, grade, labkit
from inferlab.errors import InferlabError

REPO = Path(__file__).resolve().parents[2]
LABS = grade.list_labs(REPO / "labs")


def test_labs_are_discovered():
    assert (REPO / "labs" / "00_roofline") in LABS


def grade_both_ways(lab):
    """Starter and reference results, graded side by side (each is its own subprocess)."""
    with ThreadPoolExecutor(2) as pool:
        starter = pool.submit(grade.run_lab, lab)
        reference = pool.submit(grade.run_lab, lab, reference=True)
        return starter.result(), reference.result()


@pytest.fixture(scope="module", params=LABS, ids=[p.name for p in LABS])
def graded(request):
    lab = request.param
    return (lab, *grade_both_ways(lab))


def test_every_graded_test_fails_on_the_starter(graded):
    lab, starter, _ = graded
    assert starter["tests"], f"{lab.name}: no graded tests ran"
    for t in starter["tests"]:
        assert t["max_score"] > 0, f"{lab.name}::{t['name']} is worth no points"
        assert t["score"] == 0, f"{lab.name}::{t['name']} passes on the untouched starter"
        # an unwritten function must read as such, not as a crash of the test itself
        assert t["output"].startswith("not implemented yet: "), t["output"]
    assert starter["score"] == 0


def test_every_graded_test_passes_on_the_reference(graded):
    lab, starter, reference = graded
    failed = {t["name"]: t["output"] for t in reference["tests"] if t["score"] != t["max_score"]}
    assert not failed, f"{lab.name}: the reference fails {failed}"
    assert reference["score"] == reference["max_score"] == starter["max_score"] > 0
    assert [t["name"] for t in reference["tests"]] == [t["name"] for t in starter["tests"]]


def test_points_in_readme_match_the_tests(graded):
    lab, starter, _ = graded
    readme = (lab / "README.md").read_text()
    assert f"Points ({starter['max_score']:g})" in readme
    for t in starter["tests"]:
        assert t["name"] in readme, f"{lab.name}/README.md does not list {t['name']}"


# ---------------------------------------------------------------- the grader itself

WRONG_STARTER = '''
def double(x):
    return x + x + 1  # off by one


def square(x):
    raise NotImplementedError("about 1 line")


def cube(x):
    return x * x * undefined_name
'''

TESTS = '''
from hypothesis import given, strategies as st
from inferlab import labkit

lab = labkit.implementation(__file__, reference="mini_reference", functions=["double", "square", "cube"])


@labkit.points(2)
def test_double():
    labkit.check(lab.double, 21, expected=42)


@labkit.points(1)
@given(st.integers(-100, 100))
def test_double_any(x):
    labkit.check(lab.double, x, expected=2 * x)


@labkit.points(3)
def test_square():
    labkit.check(lab.square, 3, expected=9)


def test_cube():
    labkit.check(lab.cube, 2, expected=8)
'''

REFERENCE = '''
def double(x): return 2 * x
def square(x): return x * x
def cube(x): return x ** 3
'''


@pytest.fixture(scope="module")
def mini_lab(tmp_path_factory):
    """A lab outside the repository, with its own conftest, a wrong starter and a reference."""
    root = tmp_path_factory.mktemp("labs")
    lab = root / "07_mini"
    lab.mkdir()
    shutil.copy(REPO / "labs" / "conftest.py", root / "conftest.py")
    (lab / "starter.py").write_text(WRONG_STARTER)
    (lab / "test_lab.py").write_text(TESTS)
    (root / "mini_reference.py").write_text(REFERENCE)
    return lab


@pytest.fixture(scope="module")
def mini_results(mini_lab, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("PYTHONPATH", str(mini_lab.parent))
    out = tmp_path_factory.mktemp("out") / "results.json"
    with ThreadPoolExecutor(2) as pool:
        cli_run = pool.submit(subprocess.run, [sys.executable, "-m", "inferlab", "grade", str(mini_lab),
                                               "--json", str(out)], capture_output=True, text=True)
        ref = pool.submit(grade.run_lab, mini_lab, reference=True)
        return cli_run.result(), json.loads(out.read_text()), ref.result()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_json_has_the_gradescope_shape(mini_results):
    proc, data, _ = mini_results
    assert proc.returncode == 1  # some tests failed
    assert set(data) == {"score", "max_score", "tests"}
    assert data["max_score"] == 2 + 1 + 3 + 1  # a test without a points mark is worth 1
    for t in data["tests"]:
        assert set(t) == {"name", "score", "max_score", "output"}
        assert isinstance(t["output"], str)
    assert [t["name"] for t in data["tests"]] == ["test_double", "test_double_any", "test_square", "test_cube"]
    assert data["score"] == 0


def test_a_wrong_function_shows_a_readable_diff(mini_results):
    proc, data, _ = mini_results
    by_name = {t["name"]: t["output"] for t in data["tests"]}
    assert by_name["test_double"] == textwrap.dedent("""\
        double(21)
          expected: 42
          got:      43
          (relative error 0.0238)""")
    # the property test reports the smallest failing input it found
    assert by_name["test_double_any"].startswith("double(0)\n  expected: 0\n  got:      1")
    assert by_name["test_square"] == "not implemented yet: square (about 1 line)"
    assert by_name["test_cube"].startswith("NameError: name 'undefined_name' is not defined\n"
                                           "  at starter.py, line 11, in cube")
    for text in by_name.values():
        assert "Traceback" not in text and "site-packages" not in text
    assert "FAIL  test_double" in proc.stdout and "score: 0/7" in proc.stdout


def test_reference_mode_grades_the_reference(mini_results):
    _, _, ref = mini_results
    assert ref["score"] == ref["max_score"] == 7
    assert ref["mode"] == "reference"


def test_a_missing_lab_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(InferlabError, match="no lab folder .*labs/00_roofline"):
        grade.find_lab(tmp_path / "nowhere")
    with pytest.raises(InferlabError, match="no graded tests"):
        grade.find_lab(tmp_path)
    assert cli.main(["grade", "labs/99_missing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferlab grade: error: no lab folder 'labs/99_missing'")
    assert len(err.strip().splitlines()) == 1


BROKEN_STARTER = '''
def ceiling(x):
    return {"tokens_per_s": x, "bound": "memory"
'''

DICT_TESTS = '''
from inferlab import labkit

lab = labkit.implementation(__file__, reference="mini_reference", functions=["ceiling"])


def test_ceiling():
    full = {"tokens_per_s": 2.0, "bound": "memory", "memory_s": 0.5, "compute_s": 0.1}
    labkit.check(lab.ceiling, 1, expected=full, keys=["tokens_per_s", "bound"])


def test_ceiling_again():
    labkit.check(lab.ceiling, 2, expected={"tokens_per_s": 4.0, "bound": "memory"})
'''


def _dict_lab(root: Path, starter: str) -> Path:
    lab = root / "08_dict"
    lab.mkdir(parents=True)
    shutil.copy(REPO / "labs" / "conftest.py", root / "conftest.py")
    (lab / "starter.py").write_text(starter)
    (lab / "test_lab.py").write_text(DICT_TESTS)
    return lab


def test_a_starter_that_does_not_load_is_reported_once(tmp_path):
    results = grade.run_lab(_dict_lab(tmp_path, BROKEN_STARTER))
    outputs = [t["output"] for t in results["tests"]]
    assert outputs[0].startswith("starter.py does not load") and "SyntaxError" in outputs[0]
    assert "line 3" in outputs[0] and "Traceback" not in outputs[0]
    assert outputs[1:] == [labkit.SEE_LOAD_ERROR]
    summary = grade.format_summary(results)
    assert summary.count("SyntaxError") == 1 and summary.count("does not load") == 1, summary
    assert results["score"] == 0


def test_a_dict_mismatch_shows_only_the_graded_keys(tmp_path):
    results = grade.run_lab(_dict_lab(tmp_path, "def ceiling(x):\n    return [x]\n"))
    first = results["tests"][0]["output"]
    assert "expected a dict, got list" in first and "'tokens_per_s': 2" in first
    assert "memory_s" not in first and "compute_s" not in first
