"""A real browser on the Whisper tab: the tab opens with a LibriVox clip loaded, and the default click teaches the
lesson (greedy errs, the beam searches do not); the trees stack on one step axis; the step slider redraws; Stop
ends a long run; a non-audio upload gets a message. Screenshots at 1280 and 420 px go to artifacts/browser/
(SPECLAB_UPDATE_SCREENSHOTS=1 also copies them to docs/screenshots/).
"""
from __future__ import annotations

import pytest

pytest.importorskip("whisper")

from chromium import MARKS, new_context, shot  # noqa: E402
from whisper_helpers import AUDIO, SHORT_CLIPS  # noqa: E402

pytestmark = [pytest.mark.slow, *MARKS]
ROWS = "document.querySelectorAll('#sw-results tr[data-decoder]').length"


@pytest.fixture(scope="module")
def page(browser, demo_url):
    """The shared demo and Chromium (tests/conftest.py) on a fresh context."""
    with new_context(browser, 1280, 800) as context:
        page = context.new_page()
        page.set_default_timeout(300_000)
        page.goto(demo_url)
        page.get_by_role("tab", name="Whisper").click()
        yield page


def choose_decoders(page, wanted: set[str]) -> None:
    for name in ("greedy", "beam", "filter-ends", "min-lookahead", "filter-ends+min-lookahead"):
        page.locator("#sw-decoders").get_by_label(name, exact=True).set_checked(name in wanted)


def test_the_default_click_shows_greedy_err_where_beam_search_does_not(page, monkeypatch):
    import decoders.whisper.jobs as jobs

    decodes, real = [], jobs.transcribe  # the demo runs in this process: count its decodes per click
    monkeypatch.setattr(jobs, "transcribe", lambda clip, options, should_stop=None: decodes.append(options.decoder)
                        or real(clip, options, should_stop=should_stop))
    assert page.locator("#sw-example input").input_value() == SHORT_CLIPS[0]  # loaded: one click teaches
    assert "ill disposed" in page.locator("#sw-reference textarea").input_value()
    page.click("#sw-run")
    page.wait_for_function(f"{ROWS} == 3")
    rows = {r.get_attribute("data-decoder"): r.inner_text() for r in page.locator("#sw-results tr[data-decoder]").all()}
    assert list(rows) == ["greedy", "beam", "filter-ends"]
    assert decodes == ["greedy", "beam", "filter-ends"]  # once each (the old wiring: once per output, 10x)
    assert "0.0%" not in rows["greedy"] and "0.0%" in rows["beam"]  # greedy's "old-sposed" against beam's fix
    for i in range(3):
        page.wait_for_selector(f"#sw-tree-{i} .js-plotly-plot")
    shared = page.evaluate("[0, 1, 2].map(i => JSON.stringify(document.querySelector(`#sw-tree-${i} .js-plotly-plot`)"
                           ".layout.xaxis.range))")
    assert len(set(shared)) == 1  # one step axis for every tree
    notes = page.evaluate("(() => document.querySelector('#sw-tree-1 .js-plotly-plot').layout.title.text)()")
    assert "leaves greedy at step" in notes
    shot(page, "whisper-tab-1280", publish=True, full_page=True)
    page.set_viewport_size({"width": 420, "height": 900})
    page.wait_for_timeout(1500)
    boxes = [page.locator(f"#sw-tree-{i}").bounding_box() for i in range(3)]
    assert boxes[0]["y"] + boxes[0]["height"] <= boxes[1]["y"] + 1 and boxes[1]["x"] == boxes[0]["x"]  # stacked
    assert all(b["x"] >= 0 and b["x"] + b["width"] <= 421 for b in boxes)  # nothing cut at the side
    page.wait_for_timeout(300)  # the results box re-measures its overflow on the next frame
    cut = page.evaluate("""() => { const box = document.querySelector('#sw-results .sl-scroll-x')
            .getBoundingClientRect();
        return [...document.querySelectorAll('#sw-results th')].filter(th => {
            const r = th.getBoundingClientRect(); return r.right > box.right + 1; }).map(th => th.innerText); }""")
    if cut:  # issue 35.6: time/RTF/steps were clipped with no sign that the table scrolls
        assert page.locator("#sw-results .sl-scroll-cue").is_visible(), cut
    assert all(page.get_attribute(f"#sw-results th:nth-child({i})", "title") for i in range(1, 7))
    shot(page, "whisper-tab-420", publish=True, full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    title = "(() => document.querySelector('#sw-tree-1 .js-plotly-plot').layout.title.text)()"
    assert "step 1 of" not in page.evaluate(title)
    slider = page.locator("#sw-step input[type=number]")
    slider.fill("1")
    slider.press("Enter")
    page.wait_for_function(f"{title}.includes('step 1 of')")
    assert len(decodes) == 3  # scrubbing redraws from the stored traces


def test_stop_ends_a_long_run(page):
    choose_decoders(page, {"min-lookahead", "filter-ends+min-lookahead"})
    page.click("#sw-run")
    page.wait_for_function("document.querySelector('#sw-status').innerText.includes('decoding with')")
    page.click("#sw-stop")
    page.wait_for_function("document.querySelector('#sw-status').innerText.includes('stopped')", timeout=60_000)


def test_non_audio_upload_gives_a_message(page, tmp_path):
    fake = tmp_path / "notes.wav"
    fake.write_text("not audio at all\n" * 20)
    page.locator("#sw-audio button[aria-label='Clear']").first.click()
    page.locator("#sw-audio input[type=file]").set_input_files(str(fake))
    page.click("#sw-run")
    page.wait_for_function("document.querySelector('#sw-error').innerText.includes('not an audio file')")
    page.locator("#sw-audio button[aria-label='Clear']").first.click()
    page.locator("#sw-audio input[type=file]").set_input_files(str(AUDIO / SHORT_CLIPS[1]))  # usable again
