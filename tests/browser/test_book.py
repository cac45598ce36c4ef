"""The built book in headless Chromium with the network cut off: every request to a host other
than this machine is blocked and recorded, and the pages must still draw their mermaid diagrams,
plotly figures and math from the copies the book serves itself."""
from __future__ import annotations

import functools
import http.server
import os
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root holds book/
from book import build as book  # noqa: E402

from .lab import CHROMIUM_ARGS, chromium_path  # noqa: E402

pytestmark = pytest.mark.browser

ARTIFACTS = Path(os.environ.get("INFERLAB_ARTIFACTS", book.REPO / "build" / "artifacts")) / "book"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
DRAW_TIMEOUT_MS = 60_000
NOTEBOOK_00 = "notebooks/00_why_inference_is_slow.html"


@pytest.fixture(scope="module")
def site() -> Path:
    """The built book, (re)built first when it is missing or older than its sources."""
    if book.is_stale():
        book.build()
    return book.OUT


@pytest.fixture(scope="module")
def server(site):
    """book/_build/html over HTTP on a free loopback port."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class OfflinePage:
    """A page whose requests may reach only this machine; the rest are blocked and recorded."""

    def __init__(self, browser):
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 1000})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def _route(self, route):
        url = urlparse(route.request.url)
        if url.scheme in ("file", "data", "blob") or url.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort("internetdisconnected")

    def open(self, url: str):
        self.page.goto(url, wait_until="load")
        return self.page

    def screenshot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def assert_offline_and_clean(self) -> None:
        assert not self.blocked, f"the page asked for other hosts: {self.blocked}"
        assert not self.errors, f"JavaScript errors on the page: {self.errors}"

    def close(self):
        self.context.close()


@pytest.fixture
def offline(browser):
    p = OfflinePage(browser)
    yield p
    p.close()


def test_architecture_page_draws_its_mermaid_diagram(server, offline):
    page = offline.open(f"{server}/architecture.html")
    svg = page.wait_for_selector("pre.mermaid svg", timeout=DRAW_TIMEOUT_MS)
    assert "CausalLM" in (svg.text_content() or "")  # the labels were drawn, not just an empty frame
    # readable: every label at least 12 px on screen (font size x the SVG's scale), at once or
    # after a click on a diagram that was fitted to the page width
    label_px = """() => [...document.querySelectorAll('pre.mermaid svg')].flatMap(svg => {
        const box = svg.viewBox.baseVal, scale = box && box.width ? svg.getBoundingClientRect().width / box.width : 1;
        return [...svg.querySelectorAll('.nodeLabel, .edgeLabel')].filter(l => l.textContent.trim())
            .map(l => parseFloat(getComputedStyle(l).fontSize) * scale); })"""
    offline.screenshot("architecture")
    for pre in page.locator("pre.mermaid.inferlab-zoomable").all():
        pre.click(position={"x": 5, "y": 5})
    sizes = page.evaluate(label_px)
    assert sizes and min(sizes) >= 12, f"diagram labels drawn at {min(sizes):.1f} px"
    assert page.locator("pre.mermaid.inferlab-zoomed").count() == page.locator(".inferlab-zoom-hint").count()
    offline.screenshot("architecture_zoomed")
    offline.assert_offline_and_clean()


def test_notebook_00_draws_plotly_mermaid_and_math(server, offline):
    page = offline.open(f"{server}/{NOTEBOOK_00}")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=DRAW_TIMEOUT_MS)
    # every figure snapshot the notebook stored is drawn, not only the first
    page.wait_for_function("() => [...document.querySelectorAll('.inferlab-plotly')]"
                           ".every(div => div.querySelector('svg.main-svg'))", timeout=DRAW_TIMEOUT_MS)
    assert page.locator(".js-plotly-plot").count() >= 1
    # the calculator's snapshot says it is one, and where the live version runs
    notice = page.locator(".inferlab-snapshot-notice").first.inner_text()
    assert "snapshot" in notice and "JupyterLab" in notice, notice
    page.wait_for_selector("pre.mermaid svg", timeout=DRAW_TIMEOUT_MS)
    page.wait_for_selector("mjx-container", timeout=DRAW_TIMEOUT_MS)
    offline.screenshot("notebook_00")
    offline.assert_offline_and_clean()


def test_math_renders_on_the_introduction(server, offline):
    page = offline.open(f"{server}/index.html")
    page.wait_for_selector("mjx-container", timeout=DRAW_TIMEOUT_MS)
    offline.screenshot("index")
    offline.assert_offline_and_clean()


def test_pages_opened_as_files_draw_too(site, offline):
    """A student may open book/_build/html/index.html straight from disk (file://)."""
    page = offline.open((site / "architecture.html").as_uri())
    page.wait_for_selector("pre.mermaid svg", timeout=DRAW_TIMEOUT_MS)
    page = offline.open((site / NOTEBOOK_00).as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=DRAW_TIMEOUT_MS)
    offline.assert_offline_and_clean()


def test_no_page_loads_scripts_from_other_hosts(site):
    assert book.offsite_references(site) == []


def test_the_blocker_records_what_it_blocks(server, offline):
    page = offline.open(f"{server}/index.html")
    page.evaluate("fetch('https://cdn.jsdelivr.net/npm/mermaid/dist/mermaid.min.js').catch(() => null)")
    page.wait_for_timeout(200)
    assert offline.blocked == ["https://cdn.jsdelivr.net/npm/mermaid/dist/mermaid.min.js"]
