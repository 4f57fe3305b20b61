"""The Beams tab in a real browser (Debian's headless Chromium, as tests/test_browser.py): a DSBD run with the tab's
defaults (SmolLM2, which drafts for itself: it has no paired draft) draws its forest, its width panel (D[W] with the
thres line) and its beam scores, and scrubbing redraws an earlier iteration. At 420 px the D[W] and score panels
stack. Screenshots of the whole tab at 1280 and 420 px go to docs/screenshots/ (SPECLAB_UPDATE_SCREENSHOTS=1).

Why not the Qwen pair here: it is slow on a 2-core CPU. An earlier session also saw this test's process abort at
exit ("terminate called without an active exception", rc 134) after a Qwen DSBD run inside the server: the process
finalized while a Gradio worker thread was still inside a PyTorch op (a Qwen iteration lasts seconds, long enough to
outlive the server's close). The decode slot's exit hook now waits for that thread (app/shared/decode_slot.py;
tests/test_beams_tab.py reproduces the abort with a run still computing at exit). The published screenshots
docs/screenshots/beams-forest-midrun.png and beams-width-panel.png were taken from a Qwen run."""
from __future__ import annotations

import pytest
from app_server import wait_for_opening_controls
from chromium import MARKS, legend_collisions, new_context, shot

pytestmark = [pytest.mark.slow, *MARKS]
# The run has ended: every streamed status names the peak KV, only the last one a stop reason (theme.STOP_WORDS).
FINISHED = ("(() => { const s = document.querySelector('#bm-status').innerText; return s.includes('peak KV') && "
            "(s.includes('reached the max new tokens') || s.includes('finished at end-of-sequence')); })()")


def open_beams(context, url):
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    wait_for_opening_controls(page)
    page.get_by_role("tab", name="Beams", exact=True).click()  # a visible tab at 420 px too (issue 35.6)
    return page


@pytest.fixture(scope="module")
def page(browser, demo_url):
    """The Beams tab at 1280 px on the shared demo and Chromium (tests/conftest.py)."""
    with new_context(browser, 1280, 1000) as context:
        yield open_beams(context, demo_url)


def plot(page, elem: str, expression: str):
    return page.evaluate(f"(() => {{ const d = document.querySelector('#{elem} .js-plotly-plot'); "
                         f"return d ? {expression} : null; }})()")


def test_a_dsbd_run_draws_forest_width_and_scores(page):
    page.locator("#bm-method").get_by_text("dsbd", exact=True).click()  # the draft box stays on its default
    max_tokens = page.get_by_label("number input for max tokens")
    max_tokens.fill("16")
    max_tokens.press("Enter")
    page.click("#bm-run")
    page.wait_for_function("() => { const d = document.querySelector('#bm-forest .js-plotly-plot');"
                           " return d && d.layout.title && d.layout.title.text.includes('iteration'); }",
                           timeout=600_000)
    shot(page, "beams-forest-midrun-smollm2", "#bm-forest")
    page.wait_for_function(FINISHED, timeout=600_000)
    assert page.inner_text("#bm-error").strip() == ""
    assert "drafts with smollm2-135m itself" in page.inner_text("#bm-status")
    title = plot(page, "bm-forest", "d.layout.title.text").replace("<br>", " ")
    assert "DSBD" in title or "dsbd" in title.lower()
    assert plot(page, "bm-scores", "d.data.length") >= 1
    # the run ends on its last iteration, which may draft no layer (16 tokens at 5 a round leave 1 for the target);
    # the first iteration drafted γ layers: its D[W] panel has the distributions and the thres line
    slider = page.locator("#bm-iteration input[type=range]")
    slider.focus()
    slider.press("Home")
    page.wait_for_function("() => { const t = document.querySelector('#bm-width .js-plotly-plot').layout.title;"
                           " return ((t && t.text) || '').includes('iteration 1:'); }")
    names = plot(page, "bm-width", "d.data.map(t => t.name || '')")
    assert "D[k] = P(A = k)" in names and any(n.startswith("thres = 0.7") for n in names)
    shot(page, "beams-width-panel-smollm2", "#bm-width")
    slider.press("End")


def test_scrubbing_redraws_an_earlier_iteration(page):
    slider = page.locator("#bm-iteration input[type=range]")
    slider.wait_for(state="visible", timeout=30_000)  # 16 tokens at γ 4 take several iterations
    slider.focus()
    slider.press("Home")
    page.wait_for_function("() => document.querySelector('#bm-forest .js-plotly-plot').layout.title.text"
                           ".includes('iteration 1 of')")
    shot(page, "beams-tab-1280", publish=True, full_page=True)


def test_on_a_phone_the_width_and_score_panels_stack(browser, demo_url):
    with new_context(browser, 420, 900) as context:
        page = open_beams(context, demo_url)
        page.locator("#bm-method").get_by_text("beam-sampling", exact=True).click()
        max_tokens = page.get_by_label("number input for max tokens")
        max_tokens.fill("8")
        max_tokens.press("Enter")
        page.click("#bm-run")
        page.wait_for_function(FINISHED, timeout=600_000)
        width, scores = page.locator("#bm-width").bounding_box(), page.locator("#bm-scores").bounding_box()
        assert scores["y"] >= width["y"] + width["height"] - 1  # one above the other, not side by side
        assert width["width"] > 300 and scores["width"] > 300
        assert "keep a fixed width" in plot(page, "bm-width", "d.layout.annotations[0].text").replace("<br>", " ")
        assert "max_new_tokens" not in page.inner_text("#bm-status")
        page.wait_for_selector("#bm-forest .js-plotly-plot .legend")
        assert legend_collisions(page, "#bm-forest") == []  # issue 35.6: the legend sat over the "layer" title
        assert legend_collisions(page, "#bm-scores") == []
        for elem in ("bm-forest", "bm-scores"):  # issue 35.8: both plots say what they show to a screen reader
            assert len(page.get_attribute(f"#{elem} .js-plotly-plot", "aria-label") or "") > 20
        shot(page, "beams-tab-420", publish=True, full_page=True)
