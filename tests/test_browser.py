"""A real browser: Debian's headless Chromium driven by Playwright (no browser download).

Loads the page, runs a prompt on the embedded default model, sees the tree and the highlighted text appear, moves
the round slider, clicks a token, uploads a bad trace and sees the error, races. Screenshots go to
artifacts/browser/ (or $SPECLAB_ARTIFACTS); with SPECLAB_UPDATE_SCREENSHOTS=1 the good ones are also copied to
docs/screenshots/.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("SPECLAB_ARTIFACTS", ROOT / "artifacts" / "browser"))
DOCS = ROOT / "docs" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROMPT = "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi."

from app_server import launched_demo  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make browser)")]


@pytest.fixture(scope="module")
def url():
    with launched_demo() as local_url:
        yield local_url


@pytest.fixture(scope="module")
def page(url):
    sync_api = pytest.importorskip("playwright.sync_api")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    profile = tempfile.mkdtemp(prefix="speclab-chromium-")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), args=ARGS,
                                                        headless=True, viewport={"width": 1440, "height": 1100})
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(url)
        yield page
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


def dismiss_toasts(page) -> None:
    page.evaluate("document.querySelectorAll('button.toast-close').forEach(b => b.click())")
    page.wait_for_timeout(300)


def shot(page, name: str, selector: str | None = None, publish: bool = False, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if publish:
        dismiss_toasts(page)
    path = ARTIFACTS / f"{name}.png"
    if selector:
        page.locator(selector).screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=full_page)
    if publish and os.environ.get("SPECLAB_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / path.name)
    return path


def plot_title(page, elem: str) -> str:
    return page.evaluate(f"(() => {{ const d = document.querySelector('#{elem} .js-plotly-plot');"
                         f" return d && d.layout && d.layout.title ? d.layout.title.text : ''; }})()")


def tokens(page) -> int:
    return page.locator("#sl-text span.token").count()


def test_page_shows_a_recorded_run_at_once(page):
    page.wait_for_selector("#sl-tree .js-plotly-plot")
    assert "Round" in plot_title(page, "sl-tree")
    assert tokens(page) > 0
    shot(page, "startup")


def test_run_streams_tree_and_text(page):
    page.fill("#sl-prompt textarea", PROMPT)
    page.get_by_label("float32").check()  # exact greedy equality; the page default is bfloat16
    page.click("#sl-run")
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Decoding:')")
    page.wait_for_function("document.querySelectorAll('#sl-text span.token').length > 3")
    shot(page, "generate-streaming")
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Done')", timeout=240_000)
    assert tokens(page) > 3
    assert "Round" in plot_title(page, "sl-tree")
    assert page.evaluate("document.querySelector('#sl-tree .js-plotly-plot').data.length") >= 2
    assert "τ" in page.inner_text("#sl-stats")
    shot(page, "generate-done")


def wait_title(page, prefix: str) -> None:
    page.wait_for_function("(p) => { const d = document.querySelector('#sl-tree .js-plotly-plot');"
                           " return d && d.layout.title.text.startsWith(p); }", arg=prefix, timeout=30_000)


def test_round_slider_redraws_the_tree(page):
    n_rounds = int(page.locator("#sl-round input[type=range]").get_attribute("max"))
    assert n_rounds >= 2
    slider = page.locator("#sl-round input[type=range]")
    slider.focus()
    slider.press("End")
    wait_title(page, f"Round {n_rounds}/")
    slider.press("Home")
    wait_title(page, "Round 1/")
    slider.press("ArrowRight")
    wait_title(page, "Round 2/")


def test_clicking_a_token_jumps_to_its_round(page):
    resampled = page.locator("#sl-text span.token[style*='230, 126, 34']")  # the 'resampled' colour
    target = resampled.first if resampled.count() else page.locator("#sl-text span.token").last
    target.click()
    page.wait_for_timeout(1500)
    title = plot_title(page, "sl-tree")
    assert title.startswith("Round ")
    value = page.locator("#sl-round input[type=number]").input_value()
    assert title.startswith(f"Round {value}/")
    shot(page, "adaedl-panel", "#sl-rule-row", publish=True)


def test_recorded_trace_with_rejected_branches(page):
    """Replay the recorded sampled run (no model): it opens on a round with accepted, rejected and unreached."""
    page.click("#sl-recorded input")
    page.get_by_role("option", name="static γ=4").first.click()
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Replaying')")
    statuses = page.evaluate("document.querySelector('#sl-tree .js-plotly-plot').data.map(d => d.meta)")
    assert {"accepted", "rejected"} <= set(statuses)
    shot(page, "tree-rejected", "#sl-tree", publish=True)


def test_bad_trace_upload_shows_an_error(page, tmp_path):
    bad = tmp_path / "broken-trace.json"
    bad.write_text('{"schema_version": 1, "method": "speculative"}')
    page.locator("#sl-upload input[type=file]").set_input_files(str(bad))
    page.wait_for_function("document.querySelector('#sl-error').innerText.includes('Could not load the trace')")
    assert "missing field" in page.inner_text("#sl-error")
    shot(page, "bad-trace")


def test_stop_cancels_a_run(page):
    page.get_by_text("Sampling and length").click()
    box = page.locator("#sl-max-tokens input[type=number]")
    box.fill("400")
    box.press("Enter")
    page.fill("#sl-prompt textarea", "Tell me a long story about a robot who learns to paint.")
    page.click("#sl-run")
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Decoding:')")
    page.click("#sl-stop")
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Stopped')")
    assert "stopped by the user" in page.inner_text("#sl-stats")
    page.wait_for_timeout(1000)  # a cancelled run must not overwrite the stopped view
    assert "Stopped" in page.inner_text("#sl-status")
    shot(page, "stopped")


def test_screenshot_mid_run(page):
    """The same long story again, pictured while it decodes (then stopped, to save time)."""
    page.click("#sl-run")
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Decoding:')")
    page.wait_for_function("document.querySelectorAll('#sl-text span.token').length > 12")
    shot(page, "generate-midrun", publish=True)
    page.click("#sl-stop")
    page.wait_for_function("!document.querySelector('#sl-status').innerText.includes('Decoding')")


def test_race_tab(page):
    page.get_by_role("tab", name="Race").click()
    page.click("#sl-race-run")
    page.wait_for_function("document.querySelector('#sl-race-status').innerText.includes('Done')", timeout=300_000)
    table = page.inner_text("#sl-race-table")
    assert "baseline" in table and "speedup" in table
    assert page.evaluate("document.querySelector('#sl-race-curve .js-plotly-plot').data.length") >= 2
    shot(page, "race", publish=True, full_page=True)
