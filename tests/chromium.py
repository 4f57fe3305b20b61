"""Debian's headless Chromium driven by Playwright, shared by the browser tests (Playwright never downloads one).

`MARKS` is every browser module's pytestmark; `SharedChromium` is the one Chromium all browser modules share
(tests/conftest.py's `browser`), `new_context` a fresh context (its own cookies and storage, like a new profile) on it;
`persistent_context` opens a Chromium of its own on a throwaway profile and removes it after;
`shot` saves a screenshot to artifacts/browser/ (or $SPECLAB_ARTIFACTS) and, with SPECLAB_UPDATE_SCREENSHOTS=1,
copies a published one to docs/screenshots/.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("SPECLAB_ARTIFACTS", ROOT / "artifacts" / "browser"))
DOCS = ROOT / "docs" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MARKS = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
         pytest.mark.filterwarnings("ignore::FutureWarning"),
         pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make browser)")]


def sync_api():
    """playwright.sync_api, or a skip where Playwright is not installed."""
    api = pytest.importorskip("playwright.sync_api")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    return api


class SharedChromium:
    """One Playwright driver and one Chromium for every browser module in a row: started on the first `browser()`,
    closed by tests/conftest.py once the next test no longer needs it (a second sync_playwright() inside a live one
    is refused, so a module that starts its own must not run while this one is up)."""

    def __init__(self):
        self._playwright = None
        self._browser = None

    def browser(self):
        if self._browser is None:
            self._playwright = sync_api().sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        return self._browser

    @property
    def started(self) -> bool:
        return self._playwright is not None

    def close(self) -> None:
        browser, playwright, self._browser, self._playwright = self._browser, self._playwright, None, None
        try:
            if browser is not None:
                browser.close()
        finally:
            if playwright is not None:
                playwright.stop()


@contextmanager
def new_context(browser, width: int, height: int):
    """A fresh context (no cookies, no storage: as a new profile) on the shared Chromium, closed afterwards."""
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        yield context
    finally:
        context.close()


@contextmanager
def persistent_context(pw, width: int, height: int):
    """A Chromium context on a fresh profile directory, closed and removed afterwards."""
    profile = tempfile.mkdtemp(prefix="speclab-chromium-")
    context = pw.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), args=ARGS, headless=True,
                                                    viewport={"width": width, "height": height})
    try:
        yield context
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)


def dismiss_toasts(page) -> None:
    page.evaluate("document.querySelectorAll('button.toast-close').forEach(b => b.click())")
    page.wait_for_timeout(300)


def shot(page, name: str, selector: str | None = None, publish: bool = False, full_page: bool = False) -> Path:
    """Screenshot of the page (or one element) into ARTIFACTS; a published one also goes to docs/screenshots/ when
    SPECLAB_UPDATE_SCREENSHOTS is set (toasts dismissed first, so they do not cover it)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if publish:
        dismiss_toasts(page)
    path = ARTIFACTS / f"{name}.png"
    if selector:
        page.locator(selector).screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=full_page)
    if publish and os.environ.get("SPECLAB_UPDATE_SCREENSHOTS", "0") not in ("", "0"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / path.name)
    return path


# A legend that overlaps its plot's axis titles or tick labels, or runs past the plot's right edge (clipped), for every
# plotly plot under `scope` (issue 35.6: on a phone a wrapped legend at a negative paper y covered the x-axis title).
LEGEND_COLLISIONS = """(scope) => [...document.querySelectorAll(scope + ' .js-plotly-plot')].flatMap(plot => {
    const legend = plot.querySelector('.legend'), svg = plot.querySelector('.main-svg');
    if (!legend || !svg) return [];
    const l = legend.getBoundingClientRect(), s = svg.getBoundingClientRect();
    if (!l.width) return [];
    const where = plot.parentElement.closest('[id]').id;
    const hits = [...plot.querySelectorAll('.g-xtitle, .g-x2title, .g-x3title, .g-ytitle, .xtick text, .x2tick text')]
        .filter(t => { const r = t.getBoundingClientRect();
            return r.width > 0 && r.left < l.right - 1 && l.left < r.right - 1 && r.top < l.bottom - 1 &&
                l.top < r.bottom - 1; })
        .map(t => where + ': legend over "' + t.textContent + '"');
    return l.right > s.right + 1 || l.left < s.left - 1 ? [...hits, where + ': legend clipped'] : hits; })"""


def legend_collisions(page, scope: str = "body") -> list[str]:
    return page.evaluate(LEGEND_COLLISIONS, scope)
