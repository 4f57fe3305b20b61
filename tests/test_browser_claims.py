"""The Claims tab in a real browser (Debian's headless Chromium, as tests/test_browser.py) at a laptop (1280 px) and a
phone (420 px) width: the headline table is on the first screen, the page is short (the histories are folded), no
cell is squeezed to a letter's width, nothing overflows the page sideways, the command column is dropped on a phone,
every headline cell explains itself on hover, and no machine path or outside link is shown. Screenshots go to
docs/screenshots/claims-{1280,420}.png (SPECLAB_UPDATE_SCREENSHOTS=1).

Heights measured when the page was rebuilt this way (document.body.scrollHeight, histories folded): 6,166 → 1,634 px
at 1280 and 42,589 → 4,442 px at 420; the bounds below leave room for a few more claims and longer cells."""
from __future__ import annotations

import pytest
from chromium import MARKS, new_context, shot

pytestmark = [pytest.mark.slow, *MARKS]
WIDTHS = {1280: 800, 420: 900}  # width -> viewport height
MAX_HEIGHT = {1280: 2600, 420: 7000}  # px, histories folded


@pytest.fixture(scope="module", params=list(WIDTHS))
def claims(request, browser, demo_url):
    """(width, page) with the Claims tab open, on the shared demo and Chromium (tests/conftest.py)."""
    width = request.param
    with new_context(browser, width, WIDTHS[width]) as context:
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(demo_url)
        open_tab(page, "Claims")
        page.locator("#sl-claims .sl-claims-headline").wait_for(state="visible")
        yield width, page


def open_tab(page, name: str) -> None:
    """Click a tab (every tab is a visible button, a phone's wrapping onto a second row: issue 35.6)."""
    page.get_by_role("tab", name=name, exact=True).click()


def test_the_headline_table_is_on_the_first_screen_and_the_page_is_short(claims):
    width, page = claims
    top = page.locator("#sl-claims .sl-claims-headline tbody tr").first.bounding_box()["y"]
    assert top < WIDTHS[width] - 100, f"the first claim starts at {top:.0f} px, below the first screen"
    height = page.evaluate("document.body.scrollHeight")
    assert height < MAX_HEIGHT[width], f"the Claims page is {height} px tall at {width} px"
    shot(page, f"claims-{width}", publish=True)


def test_one_headline_row_per_claim_each_cell_explained_on_hover(claims):
    from bench.claims import CLAIMS

    _, page = claims
    rows = page.locator("#sl-claims .sl-claims-headline tbody tr")
    assert rows.count() == len(CLAIMS)
    titles = page.eval_on_selector_all("#sl-claims .sl-claims-headline tbody td, #sl-claims .sl-claims-headline "
                                       "tbody th", "cells => cells.map(c => c.title)")
    assert len(titles) == 5 * len(CLAIMS) and all(t.strip() for t in titles)


def test_no_cell_is_a_letter_wide_and_nothing_overflows_sideways(claims):
    width, page = claims
    page.evaluate("document.querySelectorAll('#sl-claims details').forEach(d => d.open = true)")
    page.wait_for_timeout(300)
    narrowest = page.evaluate("""Math.min(...[...document.querySelectorAll('#sl-claims td, #sl-claims th')]
        .filter(c => c.offsetParent !== null).map(c => c.getBoundingClientRect().width))""")
    assert narrowest >= 60, f"a cell is {narrowest:.0f} px wide at {width} px"
    page_width = page.evaluate("document.documentElement.scrollWidth")
    assert page_width <= width, f"the page is {page_width} px wide in a {width} px window"
    commands = page.eval_on_selector_all("#sl-claims td.sl-claims-command",
                                         "cells => cells.map(c => getComputedStyle(c).display)")
    assert commands, "the histories show their commands on a desktop"
    if width <= 640:
        assert set(commands) == {"none"}  # dropped on a phone
    else:
        assert "none" not in commands
    shot(page, f"claims-{width}-open", full_page=True)
    page.evaluate("document.querySelectorAll('#sl-claims details').forEach(d => d.open = false)")


def test_no_machine_path_or_outside_link(claims):
    _, page = claims
    html = page.locator("#sl-claims").inner_html()
    for bad in ("/work/", "/home/", "/root/", "../shared", ".venv", "performance_anchors", "href="):
        assert bad not in html
