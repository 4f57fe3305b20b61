"""The page: `build_demo()` assembles the tabs (one module or package each, under app/tabs/); app.py launches it.

Where things are: app/tabs/<tab> holds a tab's layout and handlers, app/figures/ every figure and HTML view (pure),
app/shared/ what the tabs share (theme, glossary, the one-decode slot, a browser session's runs, hosting).
"""
from __future__ import annotations

import gradio as gr

from app.figures.batch import BATCH_CSS
from app.figures.claims import CLAIMS_CSS
from app.figures.race import RACE_CSS
from app.figures.stats import STATS_CSS
from app.figures.whisper import WHISPER_CSS
from app.shared import glossary
from app.shared.errors import log_handled
from app.shared.optional import WHISPER, build_or_explain
from app.shared.session import stop_runs_of_page
from app.shared.theme import PAGE_CSS, PAGE_JS, SCROLL_CSS
from app.tabs import beams as beams_tab
from app.tabs.batch import layout as batch_tab
from app.tabs import claims
from app.tabs import whisper as whisper_tab
from app.tabs.generate import layout as generate_tab
from app.tabs.learn import lessons
from app.tabs.race import layout as race_tab

# the layout (result right after Run on a phone) is in theme.PAGE_CSS, a wide table's scroll cue in theme.SCROLL_CSS
CSS = STATS_CSS + RACE_CSS + CLAIMS_CSS + BATCH_CSS + WHISPER_CSS + PAGE_CSS + SCROLL_CSS
INTRO = """# SpecLab · watch speculative decoding think
A small **draft** proposes a few tokens, the big **target** checks them all in one forward pass and keeps the
longest prefix it agrees with, plus one token of its own. Pick a method, press **Run**, then scrub through the
rounds. Hover over anything with a number for what it means."""


def build_demo() -> gr.Blocks:
    with gr.Blocks(title="SpecLab: watch speculative decoding think") as demo:
        gr.Markdown(INTRO)
        # "wrap": every tab stays a labelled button on a phone (Gradio's default folds the later ones behind an
        # unlabelled "⋯" menu); arrow keys move between them (theme.PAGE_JS).
        with gr.Tabs(overflow_behavior="wrap", elem_id="sl-tabs"):
            _tabs(demo)

        def page_closed(request: gr.Request) -> None:  # its runs and loads stop; the next visitor need not wait
            stopped = stop_runs_of_page(demo, request.session_hash)
            if stopped:
                log_handled("page", f"a page closed: {stopped} of its runs stopped")

        demo.unload(page_closed)
    return demo


def _tabs(demo: gr.Blocks) -> None:
    """The tabs, in order (each one module or package under app/tabs/). Generate is the page; every other tab is
    built through build_or_explain, so a piece missing on this server costs that tab alone (app/shared/optional.py)."""
    with gr.Tab("Generate", id="generate"):
        controls = generate_tab.build(demo)
    with gr.Tab("Race", id="race"):
        build_or_explain("The Race tab", (), lambda: race_tab.build(controls))
    with gr.Tab("Batch", id="batch"):
        build_or_explain("The Batch tab", (), batch_tab.build)
    with gr.Tab("Beams", id="beams"):
        beams_controls = build_or_explain("The Beams tab", (), beams_tab.build)
    with gr.Tab("Whisper", id="whisper"):
        whisper_inputs = build_or_explain("The Whisper tab", WHISPER, whisper_tab.build)
        glossary.build()
    with gr.Tab("Learn", id="learn"):
        build_or_explain("The Learn tab", (), lambda: lessons.build(controls, whisper_inputs, beams_controls))
    with gr.Tab("Claims", id="claims"):
        build_or_explain("The Claims tab", (), claims.build)


def launch_kwargs() -> dict:
    """What app.py and the tests pass to launch() (Gradio 6 takes css/theme there, not in Blocks)."""
    return {"css": CSS, "js": PAGE_JS, "theme": gr.themes.Soft(), "max_file_size": "50mb"}
