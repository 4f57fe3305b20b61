"""The Learn and Claims tabs in a real browser (Debian's headless Chromium via Playwright, as test_browser.py):
the walkthrough opens, every ready lesson draws its picture from its recorded trace with model loading refused,
"try it" fills the Generate tab, and the Claims table shows. With SPECLAB_UPDATE_SCREENSHOTS=1 the screenshots are
also copied to docs/screenshots/ (learn-*.png; the Claims tab's own are tests/test_browser_claims.py's)."""
from __future__ import annotations

import pytest
from app_server import wait_for_opening_controls
from chromium import MARKS, new_context, shot

from app.tabs.learn import lessons as teach

pytestmark = [pytest.mark.slow, *MARKS]

LOADS: list[str] = []  # model loads attempted while the page was driven (the lessons must make none)


@pytest.fixture(scope="module")
def page(browser, demo_url):
    """The shared demo and Chromium (tests/conftest.py) on a fresh context, with model loading refused: the shared
    server looks decoders.runtime.models.load_model up at each load (app/shared/loading.py), so the patch reaches it."""
    import decoders.runtime.models

    with pytest.MonkeyPatch.context() as patch:
        def refuse(name, *args, **kwargs):
            LOADS.append(name)
            raise RuntimeError("the Learn tab must not load a model")
        patch.setattr(decoders.runtime.models, "load_model", refuse)
        with new_context(browser, 1280, 1000) as context:
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(demo_url)
            wait_for_opening_controls(page)
            yield page


def _tab_name(lesson) -> str:
    return teach.tab_label(lesson)


def test_every_lesson_draws_its_picture_without_a_model(page):
    page.get_by_role("tab", name="Learn", exact=True).click()
    for lesson in teach.LESSONS:
        page.get_by_role("tab", name=_tab_name(lesson), exact=True).click()
        panel = page.get_by_role("tabpanel").filter(has=page.get_by_text(lesson.title, exact=True)).last
        panel.locator(".js-plotly-plot").first.wait_for(state="visible")
        if not lesson.coming:
            assert panel.locator(".js-plotly-plot .main-svg").count() > 0
        if lesson.title.startswith(("2.", "3.", "5.", "6.", "7.", "8.")):
            shot(page, "learn-" + lesson.figure + "-" + lesson.title.split(".")[0], publish=True, full_page=True)
    assert LOADS == []


def test_try_it_fills_the_generate_tab(page):
    lesson = teach.ready()[0]  # the baseline lesson: a prompt and method the page does not open on
    prompt = teach.lesson_trace(lesson).prompt
    page.get_by_role("tab", name="Learn", exact=True).click()
    page.get_by_role("tab", name=_tab_name(lesson), exact=True).click()
    page.get_by_role("button", name="Try it: load these settings into the Generate tab").locator("visible=true") \
        .first.click()
    page.get_by_text("Loaded: open the").first.wait_for(state="visible")
    page.get_by_role("tab", name="Generate", exact=True).click()
    box = page.locator("#sl-prompt textarea")
    page.wait_for_function("(want) => document.querySelector('#sl-prompt textarea').value === want", arg=prompt)
    assert box.input_value() == prompt
    assert LOADS == []


def test_the_whisper_lesson_s_try_it_fills_the_whisper_tab(page):
    lesson = next(lesson for lesson in teach.ready() if lesson.figure == "whisper")
    reference = teach.lesson_trace(lesson).reference
    page.get_by_role("tab", name="Learn", exact=True).click()
    page.get_by_role("tab", name=_tab_name(lesson), exact=True).click()
    page.get_by_role("button", name="Try it: load this clip and these decoders into the Whisper tab").click()
    page.get_by_text("Loaded: open the Whisper tab").first.wait_for(state="visible")
    page.get_by_role("tab", name="Whisper", exact=True).click()
    page.wait_for_function("(want) => document.querySelector('#sw-reference textarea').value === want", arg=reference)
    assert page.locator("#sw-decoders input[type=checkbox]:checked").count() == len(teach.lesson_trace(lesson).traces)
    assert LOADS == []


def test_the_claims_tab_shows_the_table(page):
    page.get_by_role("tab", name="Claims", exact=True).click()
    claims = page.locator("#sl-claims")
    claims.locator("table").first.wait_for(state="visible")
    assert claims.locator("table tr").count() > 5
    text = claims.inner_text()
    assert "Leviathan" in text and "EAGLE-2" in text and ("not measured" in text or "over our greedy baseline" in text)
    shot(page, "claims", full_page=True)


def test_the_explainer_samples_1000_times_through_the_core(page):
    page.get_by_role("tab", name="Learn", exact=True).click()
    page.get_by_text("Rejection-sampling explainer", exact=True).click()
    page.get_by_role("button", name="Sample 1,000 times").click()
    page.get_by_text("1000 draws through the verification core").wait_for(state="visible")
    page.get_by_text("sampled (1000 draws)").first.wait_for(state="visible")  # the histogram's legend entry
    shot(page, "explainer-1000", publish=True, full_page=True)


@pytest.mark.parametrize("tab", ["Generate", "Race", "Whisper", "Learn", "Claims"])
def test_the_glossary_opens_by_tap_on_every_tab(page, tab):
    page.get_by_role("tab", name=tab, exact=True).click()
    panel = page.get_by_role("tabpanel").filter(has=page.get_by_text("Glossary: τ, α, c, λ, γ, t(n)")).last
    panel.get_by_text("Glossary: τ, α, c, λ, γ, t(n)").last.click()  # a click, not a hover: works on touch
    panel.get_by_text("acceptance rate").last.wait_for(state="visible")


def test_every_lesson_is_a_tap_away_on_a_phone(page):
    """Issue 24: the lesson list was not clickable and only 2 of 8 lesson tabs showed at 420 px. The picker above the
    lessons opens each one."""
    page.set_viewport_size({"width": 420, "height": 900})
    try:
        page.wait_for_timeout(800)  # the tab bar re-lays out for the new width before it is measured
        page.get_by_role("tab", name="Learn", exact=True).click()  # the page's tabs wrap on a phone (issue 35.6)
        picker = page.locator("#sl-lesson-list")
        for lesson in teach.LESSONS:
            picker.get_by_text(lesson.title, exact=True).click()
            page.locator("#sl-lessons h3", has_text=lesson.title).filter(visible=True).first.wait_for(state="visible")
        shot(page, "learn-picker-420", publish=True, full_page=True)
    finally:
        page.set_viewport_size({"width": 1280, "height": 1000})
