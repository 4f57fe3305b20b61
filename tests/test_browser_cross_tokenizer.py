"""A real browser on the cross-tokenizer view: a trace whose draft had its own tokenizer is uploaded (made here with
the toy tokenizers, no weights), the Generate tab shows the two tokenizations under the tree, hovering a target
token names the draft pieces it came from, and a trace of another drafter hides the view again. Screenshots at
1280 px go to artifacts/browser/."""
from __future__ import annotations

import pytest
from app_server import wait_for_opening_controls
from chromium import MARKS, new_context, shot

pytestmark = [pytest.mark.slow, *MARKS]


@pytest.fixture(scope="module")
def page(browser, demo_url):
    with new_context(browser, 1280, 1000) as context:
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(demo_url)
        wait_for_opening_controls(page)
        yield page


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    from decoders import DecodeOptions, generate, retokenize
    from tiny_tokenizers import TOY_PROBES, toy_models

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retokenize, "PROBES", TOY_PROBES)
        toys = toy_models()
        options = DecodeOptions(model="toy-target", method="speculative", drafter="cross-tokenizer", gamma=5,
                                max_new_tokens=24)
        trace = generate(options, toys["target"].encode_prompt("cc ab ba"), target=toys["target"], draft=toys["other"])
    path = tmp_path_factory.mktemp("xtok") / "cross-tokenizer-toy.json"
    path.write_text(trace.to_json())
    return path


def test_the_two_tokenizations_show_under_the_tree(page, trace_file):
    page.locator("#sl-upload input[type=file]").set_input_files(str(trace_file))
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Replaying')")
    page.wait_for_selector("#sl-retokenized .js-plotly-plot")
    title = page.evaluate("document.querySelector('#sl-retokenized .js-plotly-plot').layout.title.text")
    assert "re-tokenized into" in title
    hovers = page.evaluate("[].concat(...document.querySelector('#sl-retokenized .js-plotly-plot').data"
                           ".map(d => d.hovertext || []))")
    assert any("the target's token" in h and "from " in h for h in hovers)
    page.locator("#sl-retokenized").scroll_into_view_if_needed()
    bar = page.locator("#sl-retokenized .js-plotly-plot g.point path").last
    bar.hover(force=True)
    page.wait_for_selector("#sl-retokenized .hoverlayer .hovertext", timeout=10_000)
    shot(page, "cross-tokenizer-view", "#sl-retokenized")
    shot(page, "cross-tokenizer-page")


def test_another_drafter_s_trace_hides_the_view(page):
    page.click("#sl-recorded input")
    page.get_by_role("option", name="layer skip · static γ=4").first.click()
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Replaying')")
    page.wait_for_selector("#sl-retokenized", state="hidden")
