"""What every JupyterLab browser test shares: finding Chromium, `make lab`'s server on a loopback
port (the fixtures, registered in conftest.py), and opening a notebook in a page that may reach
only that server, with its failure kept as a screenshot.

The tests drive Debian's chromium (Playwright's own browser download needs the network):
``apt-get install chromium``. They are skipped when chromium is missing, except under CI.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from inferlab.viz import workspace as ws

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("INFERLAB_ARTIFACTS", ROOT / "runs" / "artifacts"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
# Test-only user setting: keep every cell in the DOM (no virtual scrolling) so all can be read.
# Everything else (autosave on, no news prompt) is what `make lab` gives a student.
LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"}}


def require(condition: bool, message: str) -> None:
    """Skip the test when ``condition`` fails, except under CI, where it fails."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(message + " (required under CI)")
    pytest.skip(message)


def chromium_path() -> str:
    """Debian's chromium and the Playwright package, or a skip that says how to get them."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    require(path is not None, "chromium is not installed: run `apt-get install chromium` (Debian/Ubuntu) "
                              "to run the browser tests")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        require(False, "playwright is not installed: `make setup` installs it")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_jupyterlab(base: Path):
    """`make lab`'s JupyterLab (same command, environment and settings) on a free loopback port,
    serving a workspace made from this repository under ``base``, with no token. A generator:
    yields (url, workspace), stops the server when resumed."""
    workspace = base / "workspace"
    ws.sync(ROOT, workspace)
    settings = base / "user-settings"
    for name, values in LAB_SETTINGS.items():
        plugin_dir, file = name.rsplit("/", 1)
        (settings / plugin_dir).mkdir(parents=True, exist_ok=True)
        (settings / plugin_dir / file).write_text(json.dumps(values))
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(base / "config"), "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
           "JUPYTER_DATA_DIR": str(base / "data"), "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    # `inferlab` off the PATH, as in a student's shell that never activated the venv: the launcher adds it
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not (Path(p) / "inferlab").exists())
    env = ws.lab_env(env)
    cmd = ws.lab_command(workspace, "--no-browser", "--ServerApp.ip=127.0.0.1",
                         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
                         "--ServerApp.password=", "--LabApp.expose_app_in_browser=True",
                         f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={base / 'workspaces'}")
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=workspace, env=env, stdout=log, stderr=subprocess.STDOUT)  # as make lab
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
        yield url, workspace
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


def offline_context(p, chromium: str, profile, url: str, blocked: list):
    """Headless Chromium whose page may reach only the JupyterLab server at ``url`` (and data:,
    blob:, loopback websockets); every other request is aborted and recorded in ``blocked``."""
    def only_loopback(route):
        req = route.request.url
        if req.startswith((url, "data:", "blob:")) or req.startswith("ws://127.0.0.1"):
            route.continue_()
        else:
            blocked.append(req)
            route.abort()

    context = p.chromium.launch_persistent_context(
        str(profile), executable_path=chromium, headless=True,
        args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
    context.route("**/*", only_loopback)
    return context


@contextlib.contextmanager
def open_notebook(chromium: str, url: str, profile: Path, notebook: str | None, tag: str,
                  console_log: Path | None = None):
    """Open ``notebook`` (a path in the workspace; None: the page `make lab` opens first) in
    offline Chromium and wait until it is JupyterLab's current tab. Yields (page, scope), scope
    being a CSS selector for that notebook's own panel (JupyterLab also restores the tabs an
    earlier test opened). On failure the page is kept as ``jupyterlab_{tag}_failure.png/.html``
    in ARTIFACTS; on success, asserts the page raised no JavaScript error and asked for nothing
    beyond the server."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    blocked, page_errors, console = [], [], []
    with sync_playwright() as p:
        context = offline_context(p, chromium, profile, url, blocked)
        page = None
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
            page.goto(f"{url}/lab/tree/{notebook}" if notebook else url, wait_until="domcontentloaded",
                      timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=120_000)
            if notebook:
                page.wait_for_function("(path) => { const w = window.jupyterapp.shell.currentWidget;"
                                       " return w && w.context && w.context.path === path; }",
                                       arg=notebook, timeout=120_000)
            scope = '[id="%s"]' % page.evaluate("() => window.jupyterapp.shell.currentWidget.id")
            if notebook:  # (what opens first is the caller's to check)
                page.wait_for_selector(f"{scope} .jp-Notebook .jp-Cell", timeout=60_000)
            yield page, scope
        except BaseException:
            if page is not None:  # keep what the browser showed, for whoever reads the failure
                page.screenshot(path=str(ARTIFACTS / f"jupyterlab_{tag}_failure.png"))
                (ARTIFACTS / f"jupyterlab_{tag}_failure.html").write_text(page.content())
            raise
        finally:
            context.close()
            if console_log is not None:
                console_log.write_text("\n".join(console))
    assert not page_errors, f"JavaScript errors in the page: {page_errors}"
    assert not blocked, f"the page asked for non-local resources (all blocked): {blocked[:10]}"


RUN_ALL_AND_COLLECT = """
async () => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.context.ready;
  await panel.sessionContext.ready;
  await app.commands.execute("notebook:run-all-cells");
  await app.commands.execute("docmanager:save");  // what a student's Ctrl+S (or autosave) does
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


def run_all(page) -> list[dict]:
    """Run All (and save), as a student does; every code cell's outputs, none of them an error."""
    cells = page.evaluate(RUN_ALL_AND_COLLECT)
    errors = [(c["source"], o) for c in cells for o in c["outputs"] if o.get("output_type") == "error"]
    assert not errors, "cells raised:\n" + "\n\n".join(
        f"{src!r}: {o.get('ename')}: {o.get('evalue')}" for src, o in errors)
    return cells
