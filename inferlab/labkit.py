"""The toolkit graded lab tests are written with, and the pytest plugin that grades them.

A lab's tests never import the student's file directly. They go through an *adapter*::

    from inferlab import labkit
    lab = labkit.implementation(__file__, reference="inferlab.roofline",
                                functions=["weight_bytes", "kv_bytes_per_token"])

    @labkit.points(2)
    def test_seventy_billion_in_fp16():
        labkit.check(lab.weight_bytes, 70e9, 16, expected=140e9)

``lab.weight_bytes`` is the function in the lab folder's ``starter.py`` by default, and
inferlab's own function when pytest runs with ``--reference`` (inferlab is the reference
solution). ``check`` compares and, when the values differ, fails with the call, the expected
value and the value received, instead of a traceback. The hooks at the bottom turn every
failure into such a short message and, with ``--grade-json PATH``, record each test's points
for :mod:`inferlab.grade`. :mod:`inferlab.grade` loads this module as a plugin itself
(``pytest -p inferlab.labkit``), so a lab folder grades wherever it sits; ``labs/conftest.py``
imports it too, for a bare ``pytest labs/00_roofline`` in the course.
"""
from __future__ import annotations

import builtins
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

import pytest

MODE_ENV = "INFERLAB_LAB_IMPL"  # "starter" (default) or "reference"
STARTER_FILE = "starter.py"
DEFAULT_POINTS = 1

_mode = os.environ.get(MODE_ENV, "starter")


def use_reference(flag: bool) -> None:
    """Switch every adapter between the starter (False) and inferlab's reference (True)."""
    global _mode
    _mode = "reference" if flag else "starter"


def mode() -> str:
    return _mode


# ---------------------------------------------------------------- points and the adapter

def points(n: float):
    """Mark a graded test as worth ``n`` points: ``@labkit.points(2)``."""
    if n <= 0:
        raise ValueError(f"a graded test is worth a positive number of points, got {n}")
    return pytest.mark.points(n)


class Implementation:
    """Resolves each lab function to the starter's or to the reference's, at call time.

    functions: the names the student writes, or a dict {student name: reference attribute}
    when inferlab calls a function differently.
    """

    def __init__(self, lab_dir: Path, reference: str, functions):
        self.lab_dir = Path(lab_dir)
        self.reference = reference
        if isinstance(functions, dict):
            self._names = dict(functions)
        else:
            self._names = {name: name for name in functions}
        self._starter: ModuleType | None = None

    @property
    def starter_path(self) -> Path:
        return self.lab_dir / STARTER_FILE

    def starter(self) -> ModuleType:
        """The student's file, imported fresh once per test session.

        A file that does not load (a syntax error, a failing import) raises :class:`StarterLoadError`
        for every test, and the plugin shows its message under the first test only.
        """
        if self._starter is None:
            name = f"_lab_starter_{self.lab_dir.name}"
            spec = importlib.util.spec_from_file_location(name, self.starter_path)
            if spec is None or not self.starter_path.exists():
                raise FileNotFoundError(f"no {STARTER_FILE} in {self.lab_dir}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(name, None)
                raise StarterLoadError(_load_error_text(exc)) from None
            self._starter = module
        return self._starter

    def __getattr__(self, name: str):
        names = self.__dict__.get("_names", {})
        if name not in names:
            raise AttributeError(f"this lab's adapter has no function {name!r}; it has {sorted(names)}")
        if mode() == "reference":
            return getattr(importlib.import_module(self.reference), names[name])
        fn = getattr(self.starter(), name, None)
        if fn is None:
            raise LabError(f"{STARTER_FILE} has no function {name}(): keep the names the starter gives")
        return fn


def implementation(test_file: str, reference: str, functions) -> Implementation:
    """The adapter for the lab whose test file is ``test_file`` (pass ``__file__``)."""
    return Implementation(Path(test_file).resolve().parent, reference, functions)


# ---------------------------------------------------------------- readable comparisons

class LabError(AssertionError):
    """A graded check that failed; its message is what the student reads."""


class StarterLoadError(LabError):
    """The student's file could not be imported: every test fails for the same reason."""


#: What every test after the first says when starter.py does not load (the error is shown once).
SEE_LOAD_ERROR = f"{STARTER_FILE} does not load (the error is shown once, with the first test)"


def _load_error_text(exc: BaseException) -> str:
    head = f"{STARTER_FILE} does not load, so no test can run. Fix this first:"
    if isinstance(exc, SyntaxError):
        lines = [head, f"  {type(exc).__name__}: {exc.msg} ({STARTER_FILE}, line {exc.lineno})"]
        if exc.text:
            code = exc.text.rstrip("\n")
            indent = len(code) - len(code.lstrip())
            lines.append("    " + code.strip())
            if exc.offset:
                lines.append("    " + " " * max(0, exc.offset - 1 - indent) + "^")
        return "\n".join(lines)
    where = _starter_location(exc)
    return "\n".join([head, f"  {type(exc).__name__}: {exc}"] + ([f"  at {where}"] if where else []))


class Mismatch(LabError):
    """A function returned something other than the expected value."""

    def __init__(self, call: str, expected, got, detail: str = ""):
        self.call, self.expected, self.got, self.detail = call, expected, got, detail
        lines = [call, f"  expected: {_show(expected)}", f"  got:      {_show(got)}"]
        if detail:
            lines.append(f"  ({detail})")
        super().__init__("\n".join(lines))


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_show(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and hasattr(value, "name"):
        return f"{type(value).__name__}({value.name!r})"  # e.g. Hardware('H100 SXM')
    return repr(value)


def _call_repr(fn, args, kwargs) -> str:
    parts = [_show(a) for a in args] + [f"{k}={_show(v)}" for k, v in kwargs.items()]
    return f"{getattr(fn, '__name__', 'function')}({', '.join(parts)})"


def _close(expected, got, rel: float, abs_: float) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected == got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(expected, got, rel_tol=rel, abs_tol=abs_)
    return expected == got


def _relative_error(expected, got) -> str:
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)) and expected:
        return f"relative error {abs(got - expected) / abs(expected):.3g}"
    return ""


def check(fn, *args, expected, rel: float = 1e-9, abs: float = 0.0, keys=None, **kwargs):
    """Call ``fn(*args, **kwargs)`` and fail with a readable diff unless it returns ``expected``.

    Numbers compare with a relative tolerance ``rel``. For a dict result, ``keys`` lists the
    entries that must match (default: every key of ``expected``). Returns the value received.
    """
    call = _call_repr(fn, args, kwargs)
    try:
        got = fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:
        if hasattr(exc, "add_note"):
            exc.add_note(f"while calling {call}")
        raise
    if isinstance(expected, dict):
        keys = list(keys or expected)
        shown = {k: expected[k] for k in keys}  # only what the student is asked to return
        if not isinstance(got, dict):
            raise Mismatch(call, shown, got, f"expected a dict, got {type(got).__name__}")
        for key in keys:
            if key not in got:
                raise Mismatch(call, shown, got, f"the result has no key {key!r}")
            if not _close(expected[key], got[key], rel, abs):
                raise Mismatch(f"{call}[{key!r}]", expected[key], got[key],
                               _relative_error(expected[key], got[key]))
        return got
    got_value = got
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(got, bool) or not hasattr(got, "__float__"):
            raise Mismatch(call, expected, got, f"expected a number, got {type(got).__name__}")
        got_value = float(got)  # numpy and torch scalars are fine
    if not _close(expected, got_value, rel, abs):
        raise Mismatch(call, expected, got, _relative_error(expected, got_value))
    return got


def expect(condition: bool, message: str, **inputs) -> None:
    """Fail with ``message`` and the ``inputs`` that broke a property, unless ``condition``."""
    if not condition:
        shown = "".join(f"\n  {k} = {_show(v)}" for k, v in inputs.items())
        raise LabError(message + shown)


# ---------------------------------------------------------------- turning failures into text

def _innermost_frame(tb):
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    return frame


def _starter_location(exc: BaseException) -> str:
    """'starter.py, line 12, in f: <code>' for the deepest frame inside a starter file."""
    found = None
    for summary in traceback.extract_tb(exc.__traceback__):
        if Path(summary.filename).name == STARTER_FILE:
            found = summary
    if found is None:
        return ""
    return f"{STARTER_FILE}, line {found.lineno}, in {found.name}: {(found.line or '').strip()}"


_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, _GROUP) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def explain(exc: BaseException) -> str:
    """The few lines a student needs to read about a failed graded test."""
    exc = _first_leaf(exc)
    notes = [n for n in getattr(exc, "__notes__", []) if n.strip()]
    if isinstance(exc, NotImplementedError):
        frame = _innermost_frame(exc.__traceback__)
        where = frame.f_code.co_name if frame is not None else "a function"
        hint = str(exc).strip()
        return f"not implemented yet: {where}" + (f" ({hint})" if hint else "")
    if isinstance(exc, LabError):
        text = str(exc)
    elif isinstance(exc, AssertionError):
        text = "check failed: " + (str(exc).strip() or "assertion")
    else:
        text = f"{type(exc).__name__}: {exc}"
        where = _starter_location(exc)
        if where:
            text += f"\n  at {where}"
        elif isinstance(exc, TypeError):
            text += "\n  (keep the names and parameters that starter.py gives each function)"
    # Hypothesis adds the inputs it shrank to ("Falsifying example: ...") as a note; for a state
    # machine, the shortest sequence of steps it found, one note per step ("state.append(...)").
    keep = [n.strip() for n in notes if n.startswith(("while calling", "Falsifying example"))]
    steps = [n.strip() for n in notes if n.startswith(("state = ", "state.")) and n.strip() != "state.teardown()"]
    if steps:  # every step, repeats included: they are the recipe
        steps = ["the shortest sequence of steps found that fails (replay it by hand):"] + ["  " + s for s in steps]
    return "\n".join([text, *dict.fromkeys(keep), *steps])


# ---------------------------------------------------------------- the pytest plugin

def pytest_addoption(parser):
    group = parser.getgroup("inferlab lab")
    group.addoption("--reference", action="store_true",
                    help="grade inferlab's own implementation instead of the starter")
    group.addoption("--grade-json", metavar="PATH", default=None,
                    help="write each test's points and output to PATH (used by `inferlab grade`)")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): points a graded lab test is worth")
    if config.getoption("--reference", default=False):
        use_reference(True)
    try:
        from hypothesis import HealthCheck, Phase, settings
    except ImportError:  # hypothesis is optional for labs that do not use it
        pass
    else:
        # Same examples on every run, no example database written into the lab folder.
        settings.register_profile("inferlab-lab", derandomize=True, database=None, deadline=None,
                                  max_examples=60, print_blob=False,
                                  phases=[p for p in Phase if p.name != "explain"],
                                  suppress_health_check=[HealthCheck.too_slow])
        settings.load_profile("inferlab-lab")
    _session["results"] = []
    _session["load_error_shown"] = False


_session: dict = {"results": None, "load_error_shown": False}


def _points_of(item) -> float:
    mark = item.get_closest_marker("points")
    return float(mark.args[0]) if mark and mark.args else DEFAULT_POINTS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.user_properties.append(("points", _points_of(item)))
    if report.failed and call.excinfo is not None:
        text = explain(call.excinfo.value)
        if isinstance(_first_leaf(call.excinfo.value), StarterLoadError):
            if _session.get("load_error_shown"):
                text = SEE_LOAD_ERROR
            _session["load_error_shown"] = True
        report.longrepr = text
        report.user_properties.append(("explanation", text))


def pytest_runtest_logreport(report):
    results = _session["results"]
    if results is None:
        return
    props = dict(report.user_properties)
    entry = next((r for r in results if r["nodeid"] == report.nodeid), None)
    if entry is None:
        entry = {"nodeid": report.nodeid, "max_score": props.get("points", DEFAULT_POINTS),
                 "passed": True, "skipped": False, "output": ""}
        results.append(entry)
    if report.failed:
        entry["passed"] = False
        entry["output"] = entry["output"] or props.get("explanation") or str(report.longrepr)
    elif report.skipped:
        entry["skipped"] = True
        entry["passed"] = False
        entry["output"] = "skipped"


def pytest_collectreport(report):
    if _session["results"] is not None and report.failed:
        text = report.longreprtext
        errors = [line[2:] for line in text.splitlines() if line.startswith("E ")]
        _session["results"].append({
            "nodeid": report.nodeid or "collection", "max_score": 0, "passed": False,
            "skipped": False, "collection_error": True,
            "output": "could not load the tests:\n" + ("\n".join(errors) if errors else text)})


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--grade-json", default=None)
    if path:
        data = {"mode": mode(), "exitstatus": int(exitstatus),
                "tests": _session["results"] or []}
        Path(path).write_text(json.dumps(data, indent=2))
