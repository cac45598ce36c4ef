"""Every lesson in a real JupyterLab, in headless Chromium, checked the way notebook 00 is: Run All
raises nothing; on first view every trace of every figure holds its data, finite (positive on a
log axis); every control of every live widget changes the plotted data (not only a title); and
bars on a category axis carry their labels.

Opens each notebook with the shared helper of lab.py (`make lab`'s server on a workspace copy,
loopback only). Each notebook runs in full, so these are slow: run one with ``-k 06``.
"""
from __future__ import annotations

import pytest

from .lab import ARTIFACTS, open_notebook, run_all

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1500)]

# Notebook 00 and 02 have their own tests (test_jupyterlab.py, test_jupyterlab_02.py); 02 is also
# checked here, by the same rules as the rest.
NOTEBOOKS = ["01_quantization", "02_kv_cache", "03_attention_kernels", "04_speculative_decoding",
             "05_continuous_batching", "06_mixture_of_experts", "07_serving_strategies", "08_capstone",
             "09_scaling_out"]

# What plotly drew, figure by figure: per trace, the problems a reader would see. Both coordinates
# are given (one for a box or a histogram; a series of two or more y may leave x to its index), as
# finite numbers (positive on a log axis) or labels on a category axis, and as many x as y; a
# heatmap's z may hold nulls (blank cells), not only nulls. A trace with no points at all is a
# legend entry for an event the run did not have: allowed. For bars on a category axis, every
# label is drawn as a tick.
FIGURES = """
(scope) => [...document.querySelectorAll(scope + ' .jp-OutputArea .js-plotly-plot')].map((gd, index) => {
  const full = gd._fullLayout || {};
  const traces = (gd._fullData || []).map((t) => {
    const bad = [];
    const axes = {x: full[(t.xaxis || 'x').replace('x', 'xaxis')], y: full[(t.yaxis || 'y').replace('y', 'yaxis')]};
    const raw = gd.data[t.index] || {};
    const one = ['box', 'violin', 'histogram'].includes(t.type);  // one coordinate: the other is a category
    const keys = t.type === 'heatmap' ? ['z'] : t.type === 'pie' ? ['values']
               : one ? [raw.y !== undefined ? 'y' : 'x'] : ['x', 'y'];
    const data = {};
    // a trace with no points at all (a legend entry for an event this run did not have) draws nothing
    const empty = keys.every((k) => raw[k] !== undefined && raw[k] !== null && raw[k].length === 0);
    // a series given by y alone sits at x = x0 + i * dx (plotly's documented default, here the
    // step); one point without its x is still a fault (it lands at 0), and so is a missing y
    const implied = (k) => k === 'x' && ['scatter', 'bar'].includes(t.type) && raw.x === undefined
      && raw.y && raw.y.length >= 2;
    for (const key of empty ? [] : keys.filter((k) => !implied(k))) {
      const v = raw[key];
      if (v === undefined || v === null || v.length === 0) { bad.push(key + ' is missing'); continue; }
      const values = Array.from(v);
      data[key] = values;
      if (key === 'z') {
        const flat = values.flatMap((row) => Array.from(row));
        if (!flat.some((z) => typeof z === 'number' && Number.isFinite(z))) bad.push('z has no finite value');
        flat.forEach((z, j) => { if (z !== null && !(typeof z === 'number' && Number.isFinite(z)))
                                   bad.push('z[' + j + '] = ' + String(z)); });
        continue;
      }
      const axis = axes[key] || {};
      values.forEach((z, j) => {
        const label = axis.type === 'category' || axis.type === 'multicategory';
        if (label ? (z === null || z === undefined || String(z) === '')
                  : (typeof z !== 'number' || !Number.isFinite(z) || (axis.type === 'log' && z <= 0)))
          bad.push(key + '[' + j + '] = ' + String(z));
      });
    }
    if (data.x && data.y && data.x.length !== data.y.length) bad.push('x and y differ in length');
    let labels = null;
    if (t.type === 'bar' && axes.x && axes.x.type === 'category' && data.x) {
      // (spaces around a label are not seen, and SVG text may keep or drop them)
      const ticks = [...gd.querySelectorAll('g.' + (t.xaxis || 'x') + 'tick text')].map((e) => e.textContent.trim());
      const missing = data.x.filter((c) => !ticks.includes(String(c).trim()));
      if (data.x.length <= 24 && missing.length) bad.push('bars without their label: ' + missing.join(', '));
      labels = ticks;
    }
    return {name: t.name, type: t.type, bad, labels};
  });
  return {index, title: (full.title && full.title.text) || '', live: !!gd.closest('.inferlab-live-figure'), traces};
})
"""

# What a live figure plots (not its title): each trace's coordinates, labels and markers (a control
# that highlights a sequence's blocks changes their outline); what a control must change.
LIVE_DATA = """
([scope, k]) => { const out = document.querySelectorAll(scope + ' .jp-OutputArea-output:has(.inferlab-live-figure)')[k];
         const gd = out && out.querySelector('.js-plotly-plot');
         if (!gd || !gd.data) return null;
         return JSON.stringify(gd.data.map((t) => [t.x, t.y, t.z, t.values, t.text, t.marker])); }
"""


def _check_figures(page, scope: str, when: str) -> list[dict]:
    figures = page.evaluate(FIGURES, scope)
    problems = [f"figure {f['index']} {f['title']!r} / {t['type']} {t['name']!r}: {'; '.join(t['bad'][:5])}"
                for f in figures for t in f["traces"] if t["bad"]]
    assert not problems, f"{when}:\n  " + "\n  ".join(problems)
    return figures


def _controls(output) -> list[tuple[str, object]]:
    """(description, locator) for every control inside one live widget's output."""
    found = []
    sliders = output.locator(".widget-slider")
    for i in range(sliders.count()):
        found.append((f"slider {sliders.nth(i).inner_text().strip()[:30]!r}", sliders.nth(i)))
    selects = output.locator(".widget-dropdown select")
    for i in range(selects.count()):
        found.append((f"dropdown {i}", selects.nth(i)))
    toggles = output.locator(".widget-toggle-buttons")
    for i in range(toggles.count()):
        found.append((f"toggle buttons {i}", toggles.nth(i)))
    buttons = output.locator("button.widget-button:not(.widget-toggle-button)")
    for i in range(buttons.count()):
        found.append((f"button {buttons.nth(i).inner_text().strip()[:30]!r}", buttons.nth(i)))
    checks = output.locator(".widget-checkbox input")
    for i in range(checks.count()):
        found.append((f"checkbox {i}", checks.nth(i)))
    return found


def _operate(page, kind: str, control) -> None:
    """Move one control the way a student does."""
    if kind.startswith("slider"):
        handle = control.locator(".noUi-handle").first
        handle.focus()
        now, top = handle.get_attribute("aria-valuenow"), handle.get_attribute("aria-valuemax")
        handle.press("ArrowLeft" if now is not None and now == top else "ArrowRight")
    elif kind.startswith("dropdown"):
        options = control.locator("option")
        current = control.input_value()
        other = next(options.nth(i).get_attribute("value") for i in range(options.count())
                     if options.nth(i).get_attribute("value") != current)
        control.select_option(other)
    elif kind.startswith("toggle"):
        control.locator("button:not(.mod-active)").first.click()
    else:
        control.click()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_in_jupyterlab(chromium, jupyterlab, tmp_path, name):
    url, _ = jupyterlab
    with open_notebook(chromium, url, tmp_path / "chromium-profile", f"notebooks/{name}.ipynb", name) as (page, scope):
        cells = run_all(page)

        outputs = [o for c in cells for o in c["outputs"]]
        static = sum("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)
        live = sum("live in JupyterLab" in str(o.get("data", {}).get("text/plain", "")) for o in outputs)
        page.wait_for_function(
            "([scope, n]) => [...document.querySelectorAll(scope + ' .jp-OutputArea .js-plotly-plot')]"
            ".filter((gd) => gd._fullLayout && gd.querySelector('svg.main-svg')).length >= n",
            arg=[scope, static + live], timeout=120_000)
        page.wait_for_timeout(500)
        figures = _check_figures(page, scope, "on first view")
        assert sum(f["live"] for f in figures) >= live, f"{live} live widgets, fewer figures drawn"
        page.screenshot(path=str(ARTIFACTS / f"jupyterlab_{name}_first_view.png"), full_page=True)

        outs = page.locator(f"{scope} .jp-OutputArea-output:has(.inferlab-live-figure)")
        assert outs.count() == live, f"{live} live widgets in the outputs, {outs.count()} on the page"
        everywhere = _controls(page.locator(f"{scope} .jp-OutputArea"))
        in_live = sum(len(_controls(outs.nth(k))) for k in range(outs.count()))
        assert len(everywhere) == in_live, (f"{len(everywhere) - in_live} control(s) outside a live figure, which "
                                            f"this test cannot check: {[kind for kind, _ in everywhere]}")
        moved = []
        for k in range(outs.count()):
            out = outs.nth(k)
            controls = _controls(out)
            assert controls, f"live widget {k} has no control"
            for kind, control in controls:
                print(f"{name}: live widget {k}, {kind}", flush=True)
                out.evaluate("(e) => e.scrollIntoView({block: 'center'})")
                before = page.evaluate(LIVE_DATA, [scope, k])
                _operate(page, kind, control)
                try:
                    page.wait_for_function(f"(old) => ({LIVE_DATA})([{scope!r}, {k}]) !== old", arg=before,
                                           timeout=60_000)
                except Exception as exc:
                    raise AssertionError(f"live widget {k}: moving its {kind} did not change the "
                                         "plotted data") from exc
                page.wait_for_timeout(300)
                _check_figures(page, scope, f"after moving live widget {k}'s {kind}")
                moved.append(f"{k}: {kind}")
            out.screenshot(path=str(ARTIFACTS / f"jupyterlab_{name}_live_{k}.png"))
        print(f"{name}: {len(figures)} figures checked, controls moved: {moved}")
