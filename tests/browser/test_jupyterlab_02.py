"""Notebook 02 in a real JupyterLab, in headless Chromium: the allocator view draws and steps.

Reuses notebook 00's server and browser fixtures (a copy of notebooks/, loopback only)."""
from __future__ import annotations

import pytest

from .test_jupyterlab import (  # noqa: F401  (fixtures are found by name)
    ARTIFACTS, RUN_ALL_AND_COLLECT, chromium, jupyterlab, offline_context)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
NOTEBOOK = "notebooks/02_kv_cache.ipynb"  # in the workspace, as make lab serves it


def _drawn_title(page, scope: str) -> str:
    """The title plotly.js drew (its layout as drawn, not the kernel's)."""
    return page.evaluate("(sel) => document.querySelector(sel + ' .js-plotly-plot')._fullLayout.title.text", scope)

def test_notebook_02_block_pool_steps(chromium, jupyterlab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, _ = jupyterlab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    blocked, page_errors = [], []

    with sync_playwright() as p:
        context = offline_context(p, chromium, tmp_path / "chromium-profile", url, blocked)
        page = None
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.goto(f"{url}/lab/tree/{NOTEBOOK}", wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            cells = page.evaluate(RUN_ALL_AND_COLLECT)
            errors = [(c["source"], o) for c in cells for o in c["outputs"] if o.get("output_type") == "error"]
            assert not errors, "cells raised:\n" + "\n\n".join(
                f"{src!r}: {o.get('ename')}: {o.get('evalue')}" for src, o in errors)

            # Drawn by Run All alone (a viz.LiveFigure): no need to run the cell again in view.
            pool = ".inferlab-block-pool"
            page.locator(pool).scroll_into_view_if_needed(timeout=60_000)
            expect(page.locator(f"{pool} .js-plotly-plot .scatterlayer .trace").first).to_be_attached(timeout=60_000)
            assert page.locator(f"{pool} .js-plotly-plot .barlayer .trace").count() == 2
            blocks = page.locator(f"{pool} .js-plotly-plot .scatterlayer .trace").first.locator("path.point")
            expect(blocks).to_have_count(24, timeout=30_000)  # every block of the pool, drawn by Run All alone
            expect(page.locator(".jp-OutputArea .jp-RenderedMermaid img[src^='data:image/svg+xml'], "
                                ".jp-OutputArea .jp-RenderedMermaid svg").first).to_be_attached(timeout=30_000)
            assert page.locator(".jp-OutputArea .jp-RenderedMermaid.jp-mod-warning").count() == 0
            header = page.locator(f"{pool} .widget-html-content").first
            assert "step 4" in header.inner_text()
            assert _drawn_title(page, pool).startswith("step 4:")

            handle = page.locator(f"{pool} .widget-slider .noUi-handle").first
            handle.focus()
            for _ in range(5):
                page.keyboard.press("ArrowRight")
            # five steps, five whole figures: wait for the last one to be drawn, not merely the first
            page.wait_for_function(
                """(sel) => { const gd = document.querySelector(sel + " .js-plotly-plot");
                              return gd && gd._fullLayout && gd._fullLayout.title.text.startsWith("step 9:"); }""",
                arg=pool, timeout=30_000)
            expect(header).to_contain_text("step 9", timeout=30_000)
            expect(blocks).to_have_count(24, timeout=30_000)
            page.locator(pool).screenshot(path=str(ARTIFACTS / "jupyterlab_02_block_pool.png"))
        except BaseException:
            if page is not None:
                page.screenshot(path=str(ARTIFACTS / "jupyterlab_02_failure.png"))
                (ARTIFACTS / "jupyterlab_02_failure.html").write_text(page.content())
            raise
        finally:
            context.close()
    assert not page_errors, f"JavaScript errors in the page: {page_errors}"
    assert not blocked, f"the page asked for non-local resources (all blocked): {blocked[:10]}"
