"""Notebook 02 in a real JupyterLab, in headless Chromium: the allocator view draws and steps.

Opens the page with the shared helper of lab.py (`make lab`'s server on a workspace copy, loopback only)."""
from __future__ import annotations

import pytest

from .lab import ARTIFACTS, open_notebook, run_all

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
NOTEBOOK = "notebooks/02_kv_cache.ipynb"  # in the workspace, as make lab serves it


def _drawn_title(page, scope: str) -> str:
    """The title plotly.js drew (its layout as drawn, not the kernel's)."""
    return page.evaluate("(sel) => document.querySelector(sel + ' .js-plotly-plot')._fullLayout.title.text", scope)


def test_notebook_02_block_pool_steps(chromium, jupyterlab, tmp_path):
    from playwright.sync_api import expect

    url, _ = jupyterlab
    with open_notebook(chromium, url, tmp_path / "chromium-profile", NOTEBOOK, "02") as (page, scope):
        run_all(page)

        # Drawn by Run All alone (a viz.LiveFigure): no need to run the cell again in view.
        pool = f"{scope} .inferlab-block-pool"
        page.locator(pool).scroll_into_view_if_needed(timeout=60_000)
        expect(page.locator(f"{pool} .js-plotly-plot .scatterlayer .trace").first).to_be_attached(timeout=60_000)
        assert page.locator(f"{pool} .js-plotly-plot .barlayer .trace").count() == 2
        blocks = page.locator(f"{pool} .js-plotly-plot .scatterlayer .trace").first.locator("path.point")
        expect(blocks).to_have_count(24, timeout=30_000)  # every block of the pool, drawn by Run All alone
        expect(page.locator(f"{scope} .jp-OutputArea .jp-RenderedMermaid img[src^='data:image/svg+xml'], "
                            f"{scope} .jp-OutputArea .jp-RenderedMermaid svg").first).to_be_attached(timeout=30_000)
        assert page.locator(f"{scope} .jp-OutputArea .jp-RenderedMermaid.jp-mod-warning").count() == 0
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
