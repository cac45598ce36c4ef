"""Notebook 00 in a real JupyterLab, in headless Chromium: it runs, draws, and reacts.

nbval proves the notebook computes the right outputs; only a browser proves that a reader sees
them: the widget JavaScript loads with no network, plotly draws an SVG, mermaid renders, and
moving a slider makes the kernel redraw the figure.

The test drives Debian's chromium (Playwright's own browser download needs the network):
``apt-get install chromium``. It is skipped when chromium is missing, except under CI.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "00_why_inference_is_slow.ipynb"
ARTIFACTS = Path(os.environ.get("INFERLAB_ARTIFACTS", ROOT / "runs" / "artifacts"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
# JupyterLab user settings for the test: keep every cell in the DOM (no virtual scrolling),
# never write the notebook back to disk, never ask about or fetch news.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
}


def _require(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(message + " (required under CI)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    _require(path is not None, "chromium is not installed: run `apt-get install chromium` (Debian/Ubuntu) "
                               "to run the browser tests")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _require(False, "playwright is not installed: `make setup` installs it")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server on a free loopback port, serving a copy of notebooks/ (so nothing in
    the repository is modified), with no token, until the module's tests finish."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    settings = base / "user-settings"
    for name, values in LAB_SETTINGS.items():
        plugin_dir, file = name.rsplit("/", 1)
        (settings / plugin_dir).mkdir(parents=True, exist_ok=True)
        (settings / plugin_dir / file).write_text(json.dumps(values))
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(base / "config"), "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
           "JUPYTER_DATA_DIR": str(base / "data"), "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={base / 'workspaces'}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{(base / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in 90 s:\n{(base / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(base / "server.log", ARTIFACTS / "jupyterlab_server.log")


RUN_ALL_AND_COLLECT = """
async () => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.context.ready;
  await panel.sessionContext.ready;
  await app.commands.execute("notebook:run-all-cells");
  const cells = [];
  for (const cell of panel.content.model.cells) {
    if (cell.type !== "code") continue;
    const outputs = [];
    for (let i = 0; i < cell.outputs.length; i++) outputs.push(cell.outputs.get(i).toJSON());
    cells.push({source: cell.sharedModel.getSource().slice(0, 80),
                execution_count: cell.executionCount, outputs});
  }
  return cells;
}
"""


def _figure_svg(page, scope: str) -> str:
    return page.locator(f"{scope} .js-plotly-plot svg.main-svg").first.inner_html()


def test_notebook_00_runs_renders_and_reacts(chromium, jupyterlab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.glob("jupyterlab_00*"):
        stale.unlink()
    blocked, page_errors = [], []

    def only_loopback(route):
        url = route.request.url
        if url.startswith((jupyterlab, "data:", "blob:")) or url.startswith("ws://127.0.0.1"):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        page = None
        try:
            context.route("**/*", only_loopback)
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.goto(f"{jupyterlab}/lab/tree/{NOTEBOOK}", wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)

            cells = page.evaluate(RUN_ALL_AND_COLLECT)

            errors = [(c["source"], o) for c in cells for o in c["outputs"] if o.get("output_type") == "error"]
            assert not errors, "cells raised:\n" + "\n\n".join(
                f"{src!r}: {o.get('ename')}: {o.get('evalue')}" for src, o in errors)
            assert cells and all(c["execution_count"] for c in cells), \
                [c["source"] for c in cells if not c["execution_count"]]

            calc = ".inferlab-roofline-calculator"
            page.locator(calc).scroll_into_view_if_needed(timeout=60_000)
            expect(page.locator(f"{calc} .js-plotly-plot svg.main-svg").first).to_be_visible(timeout=60_000)
            assert page.locator(".jp-OutputArea .js-plotly-plot svg.main-svg").count() >= 2, \
                "the static measured-roofline figure was not drawn"
            # JupyterLab draws mermaid to an SVG and shows it as an <img> (svg, for older versions)
            expect(page.locator(".jp-OutputArea .jp-RenderedMermaid img[src^='data:image/svg+xml'], "
                                ".jp-OutputArea .jp-RenderedMermaid svg").first).to_be_attached(timeout=30_000)
            assert page.locator(".jp-OutputArea .jp-RenderedMermaid.jp-mod-warning").count() == 0, \
                "mermaid could not parse the diagram"

            before = _figure_svg(page, calc)
            header_before = page.locator(f"{calc} .widget-html-content").first.inner_text()
            slider = page.locator(f"{calc} .widget-slider").filter(has_text="batch")
            handle = slider.locator(".noUi-handle").first
            box = handle.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + 120, box["y"] + box["height"] / 2, steps=8)
            page.mouse.up()
            page.wait_for_function(
                """([sel, old]) => { const s = document.querySelector(sel + " .js-plotly-plot svg.main-svg");
                                     return s && s.innerHTML !== old; }""",
                arg=[calc, before], timeout=30_000)
            header_after = page.locator(f"{calc} .widget-html-content").first.inner_text()
            assert header_after != header_before, "the readout did not follow the slider"
            assert "batch of 1 " not in header_after

            page.locator(calc).screenshot(path=str(ARTIFACTS / "jupyterlab_00_calculator.png"))
            page.locator(".jp-OutputArea .jp-RenderedMermaid").first.screenshot(
                path=str(ARTIFACTS / "jupyterlab_00_pipeline.png"))
            page.screenshot(path=str(ARTIFACTS / "jupyterlab_00.png"))
        except BaseException:
            if page is not None:  # keep what the browser showed, for whoever reads the failure
                page.screenshot(path=str(ARTIFACTS / "jupyterlab_00_failure.png"))
                (ARTIFACTS / "jupyterlab_00_failure.html").write_text(page.content())
            raise
        finally:
            context.close()
    assert not page_errors, f"JavaScript errors in the page: {page_errors}"
    assert not blocked, f"the page asked for non-local resources (all blocked): {blocked[:10]}"
