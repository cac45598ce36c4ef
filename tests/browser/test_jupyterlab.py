"""A student's first hour, in a real JupyterLab in headless Chromium: `make lab`'s server opens
notebook 00, Run All works, every figure draws what it should, the controls redraw it, the lab is
one click away and grades from a cell, and none of it modifies a tracked file.

nbval proves the notebook computes the right outputs; only a browser proves that a reader sees
them. The figure checks read what plotly drew (each trace's coordinates and markers in the page),
not only that an SVG exists: a calculator whose decode point has no x still draws an SVG.

The test drives Debian's chromium (Playwright's own browser download needs the network):
``apt-get install chromium``. It is skipped when chromium is missing, except under CI.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from inferlab.viz import workspace as ws

from .lab import ARTIFACTS, ROOT, open_notebook, run_all

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

NOTEBOOK = "notebooks/00_why_inference_is_slow.ipynb"
LAB = "labs/00_roofline"
CALC = ".inferlab-roofline-calculator"


def _git_status() -> str:
    """Tracked course files that differ from the last commit (the test must add none)."""
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *ws.FOLDERS],
                          cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else f"(git status failed: {proc.stderr.strip()})"


# What plotly drew, figure by figure: each trace's coordinates as plotly.js holds them, and the
# problems a reader would see (a coordinate that is missing, not finite, or not positive on a log
# axis; fewer markers in the SVG than the trace has points).
FIGURES = """
() => [...document.querySelectorAll('.jp-OutputArea .js-plotly-plot')].map((gd) => {
  const full = gd._fullLayout || {};
  const log = {x: full.xaxis && full.xaxis.type === 'log', y: full.yaxis && full.yaxis.type === 'log'};
  const layers = gd.querySelectorAll('.scatterlayer g.trace');
  const traces = (gd.data || []).map((t, i) => {
    const bad = [], xy = {};
    for (const axis of ['x', 'y']) {
      const v = t[axis];
      if (v === undefined || v === null) { bad.push(axis + ' is ' + v); continue; }
      xy[axis] = Array.from(v);
      xy[axis].forEach((z, j) => {
        if (typeof z !== 'number' || !Number.isFinite(z) || (log[axis] && z <= 0))
          bad.push(axis + '[' + j + '] = ' + String(z));
      });
    }
    const n = xy.x ? xy.x.length : 0;
    if (xy.x && xy.y && xy.x.length !== xy.y.length) bad.push('x and y differ in length');
    const drawn = layers[i] ? layers[i].querySelectorAll('path.point').length : 0;
    if ((t.mode || '').includes('markers') && drawn !== n) bad.push('drew ' + drawn + ' markers for ' + n + ' points');
    return {name: t.name, x: xy.x || null, y: xy.y || null, bad};
  });
  return {title: (full.title && full.title.text) || '', calculator: !!gd.closest('%s'), traces};
})
""" % CALC


def _check_figures(page, when: str) -> dict:
    """Every trace of every figure has finite coordinates and is drawn; returns the calculator's."""
    figures = page.evaluate(FIGURES)
    assert figures, f"{when}: no plotly figure in the page"
    problems = [f"{f['title']!r} / trace {t['name']!r}: {'; '.join(t['bad'])}"
                for f in figures for t in f["traces"] if t["bad"]]
    assert not problems, f"{when}:\n  " + "\n  ".join(problems)
    calculators = [f for f in figures if f["calculator"]]
    assert len(calculators) == 1, f"{when}: expected one calculator figure, found {len(calculators)}"
    calc = {t["name"]: t for t in calculators[0]["traces"]}
    roof = next((t for name, t in calc.items() if str(name).endswith("roofline")), None)
    decode = calc.get("decode step")
    assert roof and decode, f"{when}: the calculator lacks its roofline or decode trace: {calculators[0]}"
    assert len(decode["x"]) == 1, f"{when}: the decode step is not marked"
    # the point sits on the roof: min(peak, intensity x bandwidth), the slope's bandwidth read from the line
    bandwidth, peak = roof["y"][0] / roof["x"][0], max(roof["y"])
    x, y = decode["x"][0], decode["y"][0]
    assert y == pytest.approx(min(peak, x * bandwidth), rel=1e-6), f"{when}: decode point off the roof: {decode}"
    return {"figure": calculators[0], "decode": (x, y), "on_slope": x * bandwidth < peak, "title": calculators[0]["title"]}


def _calc_state(page) -> str:
    return page.evaluate("""(sel) => { const gd = document.querySelector(sel + ' .js-plotly-plot');
        return JSON.stringify([gd.data.map(t => [t.x, t.y]), gd._fullLayout.title.text]); }""", CALC)


def _change(page, what: str, action) -> dict:
    """Move one control the way a student does, wait for the kernel to redraw, check every figure."""
    before_fig = _calc_state(page)
    before_text = page.locator(f"{CALC} .widget-html-content").first.inner_text()
    action()
    page.wait_for_function("([sel, old]) => { const gd = document.querySelector(sel + ' .js-plotly-plot');"
                           " return JSON.stringify([gd.data.map(t => [t.x, t.y]), gd._fullLayout.title.text]) !== old; }",
                           arg=[CALC, before_fig], timeout=30_000)
    page.wait_for_function("([sel, old]) => document.querySelector(sel + ' .widget-html-content').innerText !== old",
                           arg=[CALC, before_text], timeout=30_000)
    _settle(page)
    return _check_figures(page, f"after changing {what}")


def _settle(page, timeout_s: float = 60.0) -> None:
    """Wait until the kernel is idle and the calculator has stopped changing. Each key press is one
    update sent to the kernel: on a busy machine the first redraw arrives while the others are still
    queued, and the figure must be read after the last of them."""
    idle = "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'"
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        page.wait_for_function(idle, timeout=30_000)
        page.wait_for_timeout(500)  # let plotly finish drawing the markers of the update
        state = _calc_state(page) + page.locator(f"{CALC} .widget-html-content").first.inner_text()
        if state == last:
            return
        last = state
    raise AssertionError(f"the calculator was still changing after {timeout_s:.0f} s")


def _press(page, label: str, key: str, times: int = 1):
    def act():
        handle = page.locator(f"{CALC} .widget-slider").filter(has_text=label).locator(".noUi-handle").first
        handle.focus()
        for _ in range(times):
            handle.press(key)
    return act


def _kernel_output(page, code: str) -> str:
    return page.evaluate("""async (code) => {
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        let text = '';
        const future = kernel.requestExecute({code});
        future.onIOPub = (msg) => { if (msg.header.msg_type === 'stream') text += msg.content.text;
                                    if (msg.header.msg_type === 'error') text += msg.content.evalue; };
        await future.done;
        return text; }""", code)


def test_first_hour_in_jupyterlab(chromium, jupyterlab, tmp_path):
    from playwright.sync_api import expect

    url, workspace = jupyterlab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.glob("jupyterlab_00*"):
        stale.unlink()
    git_before = _git_status()

    # None: the page `make lab` opens, which must show notebook 00 first
    with open_notebook(chromium, url, tmp_path / "chromium-profile", None, "00",
                       console_log=ARTIFACTS / "jupyterlab_00_console.txt") as (page, _):
        opened = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.path")
        assert opened == NOTEBOOK, f"JupyterLab opened {opened!r} first"
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)

        cells = run_all(page)
        assert cells and all(c["execution_count"] for c in cells), \
            [c["source"] for c in cells if not c["execution_count"]]

        page.locator(CALC).scroll_into_view_if_needed(timeout=60_000)
        expect(page.locator(f"{CALC} .js-plotly-plot svg.main-svg").first).to_be_visible(timeout=60_000)
        page.wait_for_function("(n) => document.querySelectorAll('.jp-OutputArea .js-plotly-plot"
                               " svg.main-svg').length >= n", arg=2, timeout=60_000)
        page.wait_for_timeout(500)
        # JupyterLab draws mermaid to an SVG and shows it as an <img> (svg, for older versions)
        expect(page.locator(".jp-OutputArea .jp-RenderedMermaid img[src^='data:image/svg+xml'], "
                            ".jp-OutputArea .jp-RenderedMermaid svg").first).to_be_attached(timeout=30_000)
        assert page.locator(".jp-OutputArea .jp-RenderedMermaid.jp-mod-warning").count() == 0, \
            "mermaid could not parse the diagram"

        # First view: 70B fp16 batch 1 on an H100 is memory-bound, so the decode point is on the slope.
        first = _check_figures(page, "on first render")
        assert first["on_slope"] and first["decode"][0] == pytest.approx(1.0), first
        page.locator(CALC).screenshot(path=str(ARTIFACTS / "jupyterlab_00_calculator.png"))
        # The real model in four formats on this machine's roofline: a point each, and fewer bytes
        # per token put it further right (2 FLOPs per parameter over the bytes read).
        real = [f for f in page.evaluate(FIGURES) if f["title"].startswith("SmolLM2-135M")]
        assert len(real) == 1, [f["title"] for f in page.evaluate(FIGURES)]
        where = {fmt: t["x"][0] for fmt in ("fp32", "int8", "int4", "as stored") for t in real[0]["traces"]
                 if t["name"] and f"smollm2 {fmt}" in t["name"] and t["x"]}
        assert list(where) == ["fp32", "int8", "int4", "as stored"], real[0]["traces"]
        assert where["fp32"] < where["int8"] < where["int4"] < where["as stored"], where

        seen = [_change(page, "the batch", _press(page, "batch", "ArrowRight", 3))]
        assert "batch 8" in seen[-1]["title"] and seen[-1]["decode"][0] == pytest.approx(8.0)
        seen.append(_change(page, "the precision", _press(page, "precision", "ArrowRight", 2)))
        seen.append(_change(page, "the model size", _press(page, "params", "ArrowLeft", 4)))
        for hardware in ("H200 SXM", "this machine (measured)", "A100 80GB SXM"):
            seen.append(_change(page, f"the hardware to {hardware}",
                                lambda h=hardware: page.locator(f"{CALC} select").first.select_option(h)))
            assert hardware.split(" (")[0] in seen[-1]["title"]
        page.locator(CALC).screenshot(path=str(ARTIFACTS / "jupyterlab_00_calculator_after.png"))
        header = page.locator(f"{CALC} .widget-html-content").first.inner_text()
        assert "batch of 8" in header and "A100" in header, header
        assert page.get_by_text("Jupyter news").count() == 0, "JupyterLab asked about news"

        # The lab, from a cell of the notebook: `inferlab` is on the kernel's PATH.
        graded = _kernel_output(page, f"!inferlab grade ../{LAB} --quiet")
        assert "score: 0/" in graded, graded  # the untouched starter, graded in the workspace
        # "Your turn" opens the lab's README in JupyterLab (not a 404)
        link = page.locator(".jp-RenderedMarkdown a", has_text="Lab 00 · the roofline model").first
        link.scroll_into_view_if_needed()
        link.click()
        page.wait_for_function(f"() => window.jupyterapp.shell.currentWidget.context"
                               f" && window.jupyterapp.shell.currentWidget.context.path === '{LAB}/README.md'",
                               timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab_00_lab_readme.png"))

        # ... and from a JupyterLab terminal, which opens in the workspace beside labs/
        assert page.evaluate("() => window.jupyterapp.commands.hasCommand('terminal:create-new')"), \
            "JupyterLab has no terminals (is jupyter_server_terminals installed and enabled?)"
        page.evaluate("() => window.jupyterapp.commands.execute('terminal:create-new')")
        page.locator(".jp-Terminal .xterm-helper-textarea").last.focus()
        page.wait_for_timeout(1500)  # the shell prints its prompt
        page.keyboard.type(f"inferlab grade {LAB} --quiet > terminal-grade.txt 2>&1\n", delay=5)
        result = workspace / "terminal-grade.txt"
        deadline = time.monotonic() + 90
        while not (result.exists() and "score:" in result.read_text()) and time.monotonic() < deadline:
            page.wait_for_timeout(500)
        assert result.exists() and "score: 0/" in result.read_text(), \
            result.read_text() if result.exists() else "the terminal never ran the grader"

    # The run was saved to the workspace copy, and no tracked file of the course changed.
    saved = json.loads((workspace / NOTEBOOK).read_text())
    assert any(c.get("execution_count") for c in saved["cells"] if c["cell_type"] == "code")
    assert _git_status() == git_before, "running the notebook modified tracked files"
