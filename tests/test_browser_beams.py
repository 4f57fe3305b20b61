"""The Beams tab in a real browser (Debian's headless Chromium, as tests/test_browser.py): a DSBD run on the real
SmolLM2 (drafting for itself) draws its forest, its width panel (D[W] with the thres line) and its beam scores, and
scrubbing redraws an earlier iteration.

Why not the Qwen pair here: the same run on the Qwen2.5-Coder pair passes in the browser, but the test process then
aborts at exit ("terminate called without an active exception", rc 134) when the pair was loaded inside the Gradio
server's worker thread; not root-caused yet (the same DSBD run outside the server exits cleanly). The published
screenshots docs/screenshots/beams-forest-midrun.png and beams-width-panel.png were taken from that Qwen run."""
from __future__ import annotations

import pytest
from app_server import launched_demo, wait_for_opening_controls
from chromium import MARKS, persistent_context, shot, sync_api

pytestmark = [pytest.mark.slow, *MARKS]


@pytest.fixture(scope="module")
def page():
    with launched_demo() as url, sync_api().sync_playwright() as pw, persistent_context(pw, 1280, 1000) as context:
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(url)
        wait_for_opening_controls(page)
        page.get_by_role("tab", name="Beams", exact=True).click()
        yield page


def plot(page, elem: str, expression: str):
    return page.evaluate(f"(() => {{ const d = document.querySelector('#{elem} .js-plotly-plot'); "
                         f"return d ? {expression} : null; }})()")


def test_a_dsbd_run_draws_forest_width_and_scores(page):
    page.locator("#bm-method").get_by_text("dsbd", exact=True).click()
    page.click("#bm-draft input")
    page.get_by_role("option", name="smollm2-135m").first.click()
    max_tokens = page.get_by_label("number input for max tokens")
    max_tokens.fill("16")
    max_tokens.press("Enter")
    page.click("#bm-run")
    page.wait_for_function("() => { const d = document.querySelector('#bm-forest .js-plotly-plot');"
                           " return d && d.layout.title && d.layout.title.text.includes('iteration'); }",
                           timeout=600_000)
    shot(page, "beams-forest-midrun-smollm2", "#bm-forest")
    page.wait_for_function("document.querySelector('#bm-status').innerText.includes('peak KV')", timeout=600_000)
    assert page.inner_text("#bm-error").strip() == ""
    title = plot(page, "bm-forest", "d.layout.title.text").replace("<br>", " ")
    assert "DSBD" in title or "dsbd" in title.lower()
    names = plot(page, "bm-width", "d.data.map(t => t.name || '')")
    assert "D[k] = P(A = k)" in names and any(n.startswith("thres = 0.7") for n in names)
    assert plot(page, "bm-scores", "d.data.length") >= 1
    shot(page, "beams-width-panel-smollm2", "#bm-width")


def test_scrubbing_redraws_an_earlier_iteration(page):
    slider = page.locator("#bm-iteration input[type=range]")
    slider.wait_for(state="visible", timeout=30_000)  # 16 tokens at γ 4 take several iterations
    slider.focus()
    slider.press("Home")
    page.wait_for_function("() => document.querySelector('#bm-forest .js-plotly-plot').layout.title.text"
                           ".includes('iteration 1 of')")
