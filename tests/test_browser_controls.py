"""The Generate controls in a real browser: dependent controls follow the method, examples set every control.

Debian's headless Chromium driven by Playwright, as tests/test_browser.py. No model runs: these only click controls.
"""
from __future__ import annotations

import pytest
from app_server import wait_for_opening_controls
from chromium import MARKS, ROOT, new_context

pytestmark = MARKS


@pytest.fixture(scope="module")
def browser_context(browser):
    """A fresh context on the shared Chromium (tests/conftest.py)."""
    with new_context(browser, 1280, 800) as context:
        yield context


@pytest.fixture
def page(browser_context, demo_url):
    """A fresh page per test on the shared demo: each starts from the opening controls."""
    page = browser_context.new_page()
    page.set_default_timeout(60_000)
    page.goto(demo_url)
    page.locator("#sl-run").wait_for()
    wait_for_opening_controls(page)
    yield page
    page.close()


def radio(page, label: str):
    """The radio group with this label (Gradio renders a fieldset)."""
    return page.locator("fieldset").filter(has=page.get_by_text(label, exact=True)).first


def options_of(page, label: str) -> list[str]:
    return [text.strip() for text in radio(page, label).locator("label").all_inner_texts()]


def checked(page, label: str) -> str:
    return radio(page, label).locator("input:checked").get_attribute("value") or ""


def is_shown(page, label: str) -> bool:
    return page.get_by_text(label, exact=True).first.is_visible()


def slider_value(page, label: str) -> float:
    return float(page.locator(f'input[aria-label="number input for {label}"]').input_value())


def wait_slider(page, label: str, value: float) -> None:
    """The server's reply sets the slider some time after the click (seconds on a loaded machine): wait for it."""
    page.wait_for_function("([sel, v]) => { const i = document.querySelector(sel); return i && Number(i.value) === v; }",
                           arg=[f'input[aria-label="number input for {label}"]', value])


def wait_checked(page, value: str) -> None:
    page.wait_for_function("(v) => [...document.querySelectorAll('fieldset input:checked')].some(i => i.value === v)",
                           arg=value)


def choose_layer_skip_with_adaedl(page) -> None:
    """From the opening (an EAGLE-2 tree) to the layer-skip drafter with AdaEDL, as a visitor would."""
    radio(page, "Drafter").get_by_text("layer-skip", exact=True).click()
    page.wait_for_timeout(1000)
    radio(page, "Draft-length rule").get_by_text("adaedl", exact=True).click()
    wait_checked(page, "adaedl")
    page.wait_for_timeout(1000)


def test_the_page_opens_on_a_tree_with_its_own_controls(page):
    """The opening recording's drafter (a tree: suffix decoding since issue 47.1) with the controls it reads shown and
    the others hidden."""
    from app.tabs.generate.controls import OPENING, OPENING_TRACE
    from app.tabs.generate.views import read_trace_file

    assert OPENING.drafter == "suffix" and checked(page, "Drafter") == "suffix"
    assert not is_shown(page, "K (children per expanded node)") and not is_shown(page, "D (expansion steps, EAGLE-2)")
    assert not is_shown(page, "Draft-length rule") and not is_shown(page, "x (DDD: stop threshold)")
    assert not is_shown(page, "n-gram (prompt lookup)")
    recorded = read_trace_file(ROOT / "assets" / "traces" / OPENING_TRACE)
    assert page.input_value("#sl-prompt textarea") == recorded.prompt  # the recorded run's prompt


def test_eagle2_shows_its_own_controls(page):
    radio(page, "Drafter").get_by_text("eagle2", exact=True).click()
    page.wait_for_function("() => [...document.querySelectorAll('label')].some(l => l.innerText.startsWith("
                           "'K (children') && l.offsetParent !== null)")
    assert is_shown(page, "K (children per expanded node)") and is_shown(page, "D (expansion steps, EAGLE-2)")
    assert is_shown(page, "M (draft nodes sent to the target)")
    assert not is_shown(page, "Draft-length rule") and not is_shown(page, "x (DDD: stop threshold)")


def test_ddd_shows_its_own_constants(page):
    radio(page, "Drafter").get_by_text("ddd", exact=True).click()
    page.wait_for_function("() => [...document.querySelectorAll('label')].some(l => l.innerText.startsWith("
                           "'x (DDD') && l.offsetParent !== null)")
    assert is_shown(page, "S (DDD: steps that check)") and is_shown(page, "n (DDD: most expansion steps)")
    assert slider_value(page, "x (DDD: stop threshold)") == -0.3  # the DDD paper's
    assert not is_shown(page, "D (expansion steps, EAGLE-2)")


def test_prompt_lookup_moves_the_rule_and_shows_its_own_controls(page):
    choose_layer_skip_with_adaedl(page)
    assert checked(page, "Draft-length rule") == "adaedl" and is_shown(page, "initial λ")
    radio(page, "Drafter").get_by_text("prompt-lookup", exact=True).click()
    page.wait_for_function("() => [...document.querySelectorAll('fieldset input:checked')]"
                           ".some(i => i.value === 'static')")
    assert options_of(page, "Draft-length rule") == ["static", "heuristic"]
    assert checked(page, "Draft-length rule") == "static"
    assert is_shown(page, "n-gram (prompt lookup)") and is_shown(page, "γ (draft length)")
    assert not is_shown(page, "initial λ") and not is_shown(page, "Layers to skip (layer-skip)")


def test_the_lambda_slider_follows_the_rule(page):
    choose_layer_skip_with_adaedl(page)
    assert slider_value(page, "initial λ") == 0.5
    radio(page, "Draft-length rule").get_by_text("max-confidence", exact=True).click()
    wait_slider(page, "initial λ", 0.4)
    assert slider_value(page, "initial λ") == 0.4
    radio(page, "Draft-length rule").get_by_text("adaedl", exact=True).click()
    wait_slider(page, "initial λ", 0.5)
    assert slider_value(page, "initial λ") == 0.5


def test_baseline_hides_the_speculation_controls(page):
    radio(page, "Method").get_by_text("baseline", exact=True).click()
    page.wait_for_timeout(1500)
    assert not is_shown(page, "Drafter") and not is_shown(page, "Draft-length rule")


def test_a_single_model_offers_no_draft_model_drafter(page):
    page.get_by_text("chat: Explain a concept", exact=True).click()  # SmolLM2 (the page opens on the Qwen pair)
    page.wait_for_function("document.querySelector('#sl-model input').value.startsWith('smollm2')")
    page.wait_for_function("() => ![...document.querySelectorAll('#sl-drafter input')]"
                           ".some(i => i.value === 'draft-model')")
    drafters = options_of(page, "Drafter")
    assert "draft-model" not in drafters and {"prompt-lookup", "layer-skip", "eagle2"} <= set(drafters)
    radio(page, "Drafter").get_by_text("eagle2", exact=True).click()
    wait_checked(page, "eagle2")
    radio(page, "Tree grown by").locator("label").first.wait_for()  # shown by the reply to the click: wait for it
    assert options_of(page, "Tree grown by") == ["an EAGLE head (shipped or trained for the target)"]


def test_the_code_writing_example_sets_a_target_that_has_a_draft(page):
    page.get_by_text("code writing: Write a function").first.click()
    # the dropdown shows the registry label ("qwen2.5-coder-1.5b · target"), not the bare name
    page.wait_for_function("() => document.querySelector('#sl-model input').value.startsWith('qwen2.5-coder-1.5b ')")
    page.wait_for_timeout(1500)
    assert page.input_value("#sl-prompt textarea").startswith("Write a Python function")
    assert checked(page, "Drafter") == "draft-model"
    assert options_of(page, "Drafter") == ["draft-model", "prompt-lookup", "layer-skip", "cross-tokenizer", "eagle1", "eagle2",
                                          "ddd", "suffix"]
    assert is_shown(page, "Draft model") and checked(page, "Draft-length rule") == "adaedl"


def test_suffix_decoding_offers_the_cost_aware_size_with_its_explanation(page):
    """The cost controller now sizes suffix decoding's copied tree: picking the suffix drafter shows "Draft length
    cap" beside its own sliders, and the cap's explanation names what it does for suffix decoding."""
    from chromium import shot

    radio(page, "Drafter").get_by_text("suffix", exact=True).click()
    page.wait_for_function("() => [...document.querySelectorAll('input[aria-label]')]"
                           ".some(i => i.getAttribute('aria-label').includes('factor (suffix'))")
    assert is_shown(page, "Draft length cap") and is_shown(page, "min probability (suffix)")
    assert not is_shown(page, "Draft-length rule")  # a tree's size is not a chain rule's
    radio(page, "Draft length cap").get_by_text("cost-aware: what this machine verifies profitably").click()
    wait_checked(page, "cost")
    assert "suffix decoding: how much of its copied tree to send" in page.locator("#sl-controller").inner_text()
    shot(page, "suffix-cost-controls-1280")
    page.set_viewport_size({"width": 420, "height": 800})
    page.wait_for_timeout(500)
    shot(page, "suffix-cost-controls-420", full_page=True)
