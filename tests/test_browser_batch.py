"""The Batch tab in a real browser (Debian's headless Chromium): a batch of four prompts on the real SmolLM2 with
prompt lookup draws one lane per row, a lane click opens that row's rounds, and the page fits 1280 and 420 px
(screenshots batch-1280.png and batch-420.png)."""
from __future__ import annotations

import pytest
from app_server import wait_for_opening_controls
from chromium import MARKS, new_context, shot

pytestmark = [pytest.mark.slow, *MARKS]


def open_tab(context, url):
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    wait_for_opening_controls(page)
    page.get_by_role("tab", name="Batch", exact=True).click()
    return page


def run_batch(page):
    max_tokens = page.get_by_label("number input for max tokens per row")
    max_tokens.fill("24")
    max_tokens.press("Enter")
    page.click("#bt-run")
    page.wait_for_function("() => document.querySelector('#bt-status').innerText.includes('4 finished')",
                           timeout=600_000)
    assert page.inner_text("#bt-error").strip() == ""


@pytest.mark.parametrize("width, height", [(1280, 1000), (420, 900)])
def test_a_batch_draws_lanes_and_a_lane_opens_its_row(browser, demo_url, width, height):
    """On the shared demo and Chromium (tests/conftest.py), a fresh context per width."""
    with new_context(browser, width, height) as context:
        page = open_tab(context, demo_url)
        run_batch(page)
        assert page.locator("#bt-lanes button.bt-lane").count() == 4
        assert page.locator("#bt-lanes .bt-pad").count() > 1  # padding drawn as padding
        page.locator("#bt-lanes button.bt-lane[data-row='2']").click()
        page.wait_for_function("() => document.querySelector('#bt-row-title').innerText.includes('Row 3')")
        assert page.locator("#bt-lanes button.bt-selected[data-row='2']").count() == 1
        title = page.evaluate("document.querySelector('#bt-tree .js-plotly-plot').layout.title.text")
        assert "round" in title.lower()
        page.locator("#bt-lanes").scroll_into_view_if_needed()
        clipped = page.evaluate("""() => { const box = document.querySelector('#bt-lanes .sl-scroll-x')
                .getBoundingClientRect();
            return [...document.querySelectorAll('#bt-lanes .bt-count')].filter(c => {
                const r = c.getBoundingClientRect(); return r.right > box.right + 1 || r.left < box.left - 1; })
                .map(c => c.innerText); }""")
        assert clipped == [], "a lane's count is cut off (issue 35.6: it sat after the track)"
        overflows = page.get_attribute("#bt-lanes .sl-scroll", "data-overflows") is not None
        assert page.locator("#bt-lanes .sl-scroll-cue").is_visible() == overflows  # the cue shows only when needed
        shot(page, f"batch-{width}", publish=True, full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, "the page scrolls sideways (the lanes scroll inside their own box instead)"
