"""A real browser: Debian's headless Chromium driven by Playwright (no browser download).

Loads the page, runs a prompt on the embedded default model, sees the tree and the highlighted text appear, moves
the round slider, clicks a token, uploads a bad trace and sees the error, races. Screenshots go to
artifacts/browser/ (or $SPECLAB_ARTIFACTS); with SPECLAB_UPDATE_SCREENSHOTS=1 the good ones are also copied to
docs/screenshots/.
"""
from __future__ import annotations

import pytest
from app_server import wait_for_opening_controls
from chromium import MARKS, ROOT, new_context, shot

from app.shared.theme import PROVENANCE_COLORS, rgba

PROMPT = "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi."

pytestmark = [pytest.mark.slow, *MARKS]


@pytest.fixture(scope="module")
def page(browser, demo_url):
    """The shared demo and Chromium (tests/conftest.py) on a fresh context."""
    with new_context(browser, 1440, 1100) as context:
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(demo_url)
        wait_for_opening_controls(page)
        yield page


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


def choose(page, group: str, value: str) -> None:
    """Click a radio choice in the group with this label (Gradio renders a fieldset)."""
    fieldset = page.locator("fieldset").filter(has=page.get_by_text(group, exact=True)).first
    fieldset.get_by_text(value, exact=True).click()
    page.wait_for_function("(v) => [...document.querySelectorAll('fieldset input:checked')].some(i => i.value === v)",
                           arg=value)


def test_run_streams_tree_and_text(page):
    page.get_by_text("chat: Explain a concept", exact=True).click()  # SmolLM2 (the page opens on the Qwen pair)
    page.wait_for_function("document.querySelector('#sl-model input').value.startsWith('smollm2')")
    page.fill("#sl-prompt textarea", PROMPT)
    choose(page, "Drafter", "layer-skip")  # the page opens on an EAGLE-2 tree; AdaEDL fills the rule panel
    page.wait_for_timeout(1000)  # the rule choices follow the drafter
    choose(page, "Draft-length rule", "adaedl")
    page.get_by_label("float32", exact=True).check()  # the explicit choice (auto is float32 too)
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
    resampled = page.locator(f"#sl-text span.token[style*='{rgba(PROVENANCE_COLORS['resampled'], 0.5)}']")
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
    page.get_by_role("option", name="layer skip · static γ=4").first.click()
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


def wait_status(page, text: str, timeout: float = 120_000) -> None:
    """Wait until the status line contains `text`; on a timeout say what it showed instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("(t) => document.querySelector('#sl-status').innerText.includes(t)", arg=text,
                               timeout=timeout)
    except PlaywrightTimeout:
        shown = page.inner_text("#sl-status"), page.inner_text("#sl-error")
        raise AssertionError(f"status never showed {text!r}; it shows {shown[0]!r} (error: {shown[1]!r})") from None


def test_stop_cancels_a_run(page):
    page.get_by_text("Sampling and length").click()
    box = page.locator("#sl-max-tokens input[type=number]")
    box.fill("400")
    box.press("Enter")
    page.fill("#sl-prompt textarea", "Tell me a long story about a robot who learns to paint.")
    page.click("#sl-run")
    page.wait_for_function("document.querySelector('#sl-status').innerText.includes('Decoding:')")
    page.click("#sl-stop")
    wait_status(page, "Stopped")
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


# ---- the first page at a desktop and a phone width (issue 10 #3, #11, #12, #14) ---------------------------------
# A fresh page per width on the recorded run the page opens on: no model, a few seconds each.

WIDTHS = {"1280": {"width": 1280, "height": 800}, "420": {"width": 420, "height": 900}}


@pytest.fixture(scope="module", params=list(WIDTHS))
def opened(request, browser, demo_url):
    """(width name, page) on the opening page; the Generate and Race screenshots go to after-<tab>-<width>.png."""
    page = browser.new_page(viewport=WIDTHS[request.param])  # a page in a context of its own, closed with it
    page.set_default_timeout(60_000)
    page.goto(demo_url)
    wait_for_opening_controls(page)
    page.wait_for_selector("#sl-tree .js-plotly-plot")
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot[aria-label]').length >= 4")
    shot(page, f"after-generate-{request.param}", publish=True, full_page=True)
    yield request.param, page
    page.close()


def box(page, selector: str) -> dict:
    """The element's rectangle in page coordinates (scroll-independent)."""
    return page.evaluate("(s) => { const r = document.querySelector(s).getBoundingClientRect();"
                         " return {left: r.left + scrollX, right: r.right + scrollX, top: r.top + scrollY,"
                         " bottom: r.bottom + scrollY, width: r.width, height: r.height}; }", selector)


def shown_round_number(page) -> int:
    return int(page.locator("#sl-round input[type=number]").input_value())


def test_opening_page_shows_one_round(opened):
    _, page = opened
    number = shown_round_number(page)
    assert plot_title(page, "sl-tree").startswith(f"Round {number}/")
    assert f"round {number}'s tokens" in page.inner_text("#sl-legend")
    assert "laptop CPU" in page.inner_text("#sl-legend")
    from app.tabs.generate.views import OPENING_TRACE, read_trace_file

    label = read_trace_file(ROOT / "assets" / "traces" / OPENING_TRACE).label
    assert page.input_value("#sl-recorded input").startswith(label)


def test_result_comes_right_after_run(opened):
    width, page = opened
    run, text = box(page, "#sl-run"), box(page, "#sl-text")
    if width == "420":
        assert 0 <= text["top"] - run["bottom"] <= 160  # only the status line between them
    else:
        assert text["left"] > run["right"]  # beside the controls
        assert text["top"] < WIDTHS[width]["height"]  # on the first screen


def test_examples_sit_next_to_run(opened):
    width, page = opened
    run, examples, text = box(page, "#sl-run"), box(page, "#sl-examples"), box(page, "#sl-text")
    assert examples["top"] >= run["bottom"]
    if width == "420":
        assert examples["top"] > text["bottom"]  # after the result on a phone
    else:
        assert examples["top"] - run["bottom"] < 60
        assert examples["bottom"] < WIDTHS[width]["height"]


def test_nothing_overflows_sideways(opened):
    width, page = opened
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width]["width"]
    wide = page.evaluate("(w) => [...document.querySelectorAll('#sl-main *')].filter(e => {"
                         " const r = e.getBoundingClientRect(); return r.width > 0 && r.right > w + 1; })"
                         ".map(e => e.id || e.className).slice(0, 5)", WIDTHS[width]["width"])
    assert wide == []


def test_plots_keep_their_width_and_titles_stay_inside(opened):
    width, page = opened
    positions, rounds = box(page, "#sl-positions"), box(page, "#sl-rounds")
    if width == "420":
        assert positions["width"] >= 340 and rounds["width"] >= 340  # stacked, each the full column
        assert rounds["top"] >= positions["bottom"]
    else:
        assert positions["width"] >= 360 and rounds["width"] >= 360
        assert rounds["top"] == positions["top"]  # side by side
    outside = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
        const p = plot.getBoundingClientRect();
        return [...plot.querySelectorAll('.gtitle, .annotation-text, .g-xtitle, .g-ytitle, .g-y2title')]
            .filter(t => { const r = t.getBoundingClientRect(); return r.width > 0 &&
                (r.left < p.left - 1 || r.right > p.right + 1 || r.top < p.top - 1 || r.bottom > p.bottom + 1); })
            .map(t => plot.parentElement.closest('[id]').id + ': ' + t.textContent); })""")
    assert outside == []


def test_titles_do_not_collide(opened):
    _, page = opened
    overlaps = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
        const items = [...plot.querySelectorAll('.gtitle, .annotation-text, .g-xtitle text, .g-ytitle text')]
            .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
        const hits = [];
        items.forEach(([a, ra], i) => items.slice(i + 1).forEach(([b, rb]) => {
            if (ra.left < rb.right && rb.left < ra.right && ra.top < rb.bottom && rb.top < ra.bottom)
                hits.push(a + ' / ' + b); }));
        return hits; })""")
    assert overlaps == []


def test_plots_have_text_alternatives(opened):
    _, page = opened
    labels = page.evaluate("[...document.querySelectorAll('#sl-main .js-plotly-plot')]"
                           ".map(d => [d.getAttribute('role'), d.getAttribute('aria-label') || ''])")
    assert len(labels) == 4  # tree, two rule panels, statistics
    for role, label in labels:
        assert role == "figure"
        assert len(label) > 20
    number = shown_round_number(page)
    tree_label = page.get_attribute("#sl-tree .js-plotly-plot", "aria-label")
    assert tree_label.startswith(f"Round {number}/")


def test_provenance_is_underlined_as_well_as_coloured(opened):
    _, page = opened
    from app.shared.theme import PROVENANCE_UNDERLINES

    seen = page.evaluate("""() => [...document.querySelectorAll('#sl-text .token')].map(t =>
        [t.getAttribute('style'), getComputedStyle(t).textDecorationStyle, getComputedStyle(t).textDecorationLine])""")
    checked = set()
    for name, color in PROVENANCE_COLORS.items():
        styles = {(style, line) for attr, style, line in seen if rgba(color, 0.5) in (attr or "")}
        if styles:
            assert styles == {(PROVENANCE_UNDERLINES[name], "underline")}, name
            checked.add(name)
    assert {"accepted", "bonus"} <= checked  # the opening Qwen run (τ 6.4) shows these; every one shown is checked


def outlined_texts(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#sl-text .token')]"
                         ".filter(t => getComputedStyle(t).outlineStyle === 'solid').map(t => t.textContent.trim())")


def test_tokens_work_from_the_keyboard_and_the_shown_round_is_marked(opened):
    _, page = opened
    from app.figures.text import display_groups
    from app.tabs.generate.views import OPENING_TRACE, read_trace_file

    trace = read_trace_file(ROOT / "assets" / "traces" / OPENING_TRACE)
    groups = display_groups(trace)
    tokens = page.locator("#sl-text .token")
    assert tokens.first.get_attribute("role") == "button"
    assert tokens.first.get_attribute("tabindex") == "0"
    tokens.first.focus()
    plain = next((i for i, g in enumerate(groups) if "\n" in "".join(trace.tokens[t].text for t in g)), len(groups))
    steps = min(4, plain - 1)  # stay among the leading spans without a line break (one token element each)
    assert steps >= 1
    for _ in range(steps):
        page.keyboard.press("ArrowRight")  # Gradio moves the focus from token to token
    focused = page.evaluate("[...document.querySelectorAll('#sl-text .token')].indexOf(document.activeElement)")
    assert focused == steps
    page.keyboard.press("Enter")
    expected = trace.tokens[groups[steps][-1]].round + 1
    page.wait_for_function("(n) => document.querySelector('#sl-round input[type=number]').value == String(n)",
                           arg=expected)
    wait_title(page, f"Round {expected}/")
    page.wait_for_function("(n) => document.querySelector('#sl-legend').innerText.includes(`round ${n}'s`)",
                           arg=expected)
    want = [trace.tokens[g[-1]].round == expected - 1 for g in groups]
    texts = ["".join(trace.tokens[i].text for i in g).strip() for g, keep in zip(groups, want) if keep]
    assert outlined_texts(page) == [t for t in texts if t]


def test_race_tab_fits(opened):
    width, page = opened
    page.get_by_role("tab", name="Race").click()
    page.wait_for_selector("#sl-race-curve .js-plotly-plot")
    page.wait_for_timeout(500)
    speed, curve = box(page, "#sl-race-speed"), box(page, "#sl-race-curve")
    methods, length = box(page, "#sl-race-methods"), box(page, "#sl-race-tokens")
    if width == "420":
        assert curve["top"] >= speed["bottom"] and curve["width"] >= 340
        assert length["top"] >= methods["bottom"] and methods["width"] >= 340  # the settings stack too
    else:
        assert curve["top"] == speed["top"] and curve["width"] >= 360
        assert length["top"] == methods["top"]
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width]["width"]
    shot(page, f"after-race-{width}", publish=True, full_page=True)
    page.get_by_role("tab", name="Generate").click()
