"""A real browser on the Whisper tab: upload a LibriVox clip, transcribe with greedy and standard beam, see both
transcripts with WER and two beam trees, scrub a step, and see the message for a non-audio upload.
Screenshots go to artifacts/browser/ (SPECLAB_UPDATE_SCREENSHOTS=1 also copies the good one to docs/screenshots/).
"""
from __future__ import annotations

import pytest

pytest.importorskip("whisper")

from app_server import launched_demo  # noqa: E402
from chromium import MARKS, persistent_context, shot, sync_api  # noqa: E402
from whisper_helpers import AUDIO, CLIPS, SHORT_CLIPS  # noqa: E402

pytestmark = [pytest.mark.slow, *MARKS]


@pytest.fixture(scope="module")
def page():
    with launched_demo() as url, sync_api().sync_playwright() as pw, persistent_context(pw, 1440, 1100) as context:
        page = context.new_page()
        page.set_default_timeout(180_000)
        page.goto(url)
        page.get_by_role("tab", name="Whisper").click()
        yield page


def choose_decoders(page, wanted: set[str]) -> None:
    for name in ("greedy", "beam", "filter-ends", "min-lookahead", "filter-ends+min-lookahead"):
        box = page.locator("#sw-decoders").get_by_label(name, exact=True)
        box.set_checked(name in wanted)


def test_upload_transcribe_and_see_two_trees(page):
    name = SHORT_CLIPS[0]
    page.locator("#sw-audio input[type=file]").set_input_files(str(AUDIO / name))
    page.locator("#sw-reference textarea").fill(CLIPS[name]["reference"])
    choose_decoders(page, {"greedy", "beam"})
    page.click("#sw-run")
    page.wait_for_function("document.querySelectorAll('#sw-results tr[data-decoder]').length == 2")
    results = page.inner_text("#sw-results")
    assert "young man" in results.lower() and "%" in results
    for i in (0, 1):
        page.wait_for_selector(f"#sw-tree-{i} .js-plotly-plot")
    points = page.evaluate("(() => { const d = document.querySelector('#sw-tree-1 .js-plotly-plot');"
                           " return d.data.filter(t => t.mode === 'markers+text').reduce((n, t) => n + t.x.length, 0); })()")
    assert points > 5
    shot(page, "whisper-tab", publish=True, full_page=True)
    title = "(() => document.querySelector('#sw-tree-1 .js-plotly-plot').layout.title.text)()"
    assert "step 1 of" not in page.evaluate(title)
    slider = page.locator("#sw-step input[type=number]")
    slider.fill("1")
    slider.press("Enter")
    page.wait_for_function(f"{title}.includes('step 1 of')")


def test_non_audio_upload_gives_a_message(page, tmp_path):
    fake = tmp_path / "notes.wav"
    fake.write_text("not audio at all\n" * 20)
    page.locator("#sw-audio button[aria-label='Clear']").first.click()
    page.locator("#sw-audio input[type=file]").set_input_files(str(fake))
    page.click("#sw-run")
    page.wait_for_function("document.querySelector('#sw-error').innerText.includes('not an audio file')")
