"""What the page's controls accept (app/shared/boxes.py), through Gradio's own event processing on the built page.

Issue 47.3: a slider's number box clamped what was typed (T = 100 ran as 2) after Gradio's check raised a traceback
into the server log. Issue 47.4: one pick in the target dropdown sends its event twice; the first reply narrowed the
tree source's choices on the server and the second, still carrying the old value, was refused before the handler ran
("Value: 'draft-model' is not in the list of choices: ['auto']"), its update lost.
"""
from __future__ import annotations

import asyncio

import gradio as gr
import pytest
from gradio.state_holder import SessionState

from decoders.options import OptionsError

from app.page import build_demo
from app.shared.boxes import Bounded, OutOfRange, Scrubber
from app.tabs.generate.controls import DEPENDENT, control_states, drafters_for
from app.tabs.generate.layout import model_choices

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
DECIDING = ("model", "method", "drafter", "rule", "temperature", "draft_model", "eagle_head", "controller")
# sliders that scrub through a finished run (their handlers take any position), not settings of a run
SCRUBBERS = ("Round", "round of this row", "iteration (scrub through the run)", "step (scrub through the search)")


@pytest.fixture(scope="module")
def demo():
    return build_demo()


def _block(demo, elem_id: str):
    return next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def test_every_setting_slider_refuses_out_of_range_in_words(demo):
    """Every slider a run reads (Generate, Race, Batch, Beams, Whisper) is Bounded: out of range it hands the handler
    an OutOfRange that names the box and its range, never a clamped number or a gradio.exceptions.Error."""
    read = {id(block) for fn in demo.fns.values() for block in fn.inputs}
    sliders = [b for b in demo.blocks.values()
               if isinstance(b, gr.Slider) and id(b) in read and b.label not in SCRUBBERS]
    plain = [b.label for b in sliders if not isinstance(b, Bounded) and "draft disagrees" not in b.label
             and "siblings" not in b.label]  # the Learn tab's toy explainer has no run to refuse
    assert not plain, plain
    for box in (b for b in sliders if isinstance(b, Bounded)):
        above = box.preprocess(box.maximum + 98)
        assert isinstance(above, OutOfRange) and above == box.maximum + 98, box.label
        assert above.message.startswith(f"{box.label} must be from ") and f"got {box.maximum + 98:g}" in above.message
        assert isinstance(box.preprocess(box.minimum - 2), OutOfRange)
        assert box.preprocess(box.minimum) == box.minimum
        assert "is empty" in box.preprocess(None).message


def test_a_position_typed_past_the_end_of_a_run_means_that_end_without_a_traceback(demo):
    """The round, row-round, iteration and step sliders pick a position in a finished run: past either end is that
    end (Gradio's own raised gradio.exceptions.Error, with a traceback in the server log)."""
    scrubbers = [b for b in demo.blocks.values() if isinstance(b, gr.Slider) and b.label in SCRUBBERS]
    assert len(scrubbers) == len(SCRUBBERS) and all(isinstance(b, Scrubber) for b in scrubbers)
    for box in scrubbers:
        assert box.preprocess(box.maximum + 50) == box.maximum and box.preprocess(-3) == box.minimum
        assert box.preprocess(None) == box.minimum and "sl-scrubber" in box.elem_classes


def test_each_tab_refuses_an_out_of_range_box_with_its_sentence():
    from app.tabs import beams
    from app.tabs.batch import handlers as batch
    from app.tabs.generate import handlers as generate
    from app.tabs.race import runs as race
    from app.tabs.whisper import handlers as whisper

    hot = OutOfRange(100.0, "temperature must be from 0 to 2, got 100")
    with pytest.raises(OptionsError, match="temperature must be from 0 to 2, got 100"):
        generate.options_from({"method": "speculative", "temperature": hot})
    with pytest.raises(OptionsError, match="got 100"):
        race.race_options({"methods": ["static γ=4"], "temperature": hot})
    with pytest.raises(OptionsError, match="got 100"):
        batch.options_for("smollm2-135m", next(iter(batch.METHODS)), "prompt-lookup", 16, hot)
    with pytest.raises(OptionsError, match="got 100"):
        beams.options_for("beam-search", "smollm2-135m", None, hot, 4, 0.7, 1, next(iter(beams.MEMORY_MODES)), 8, 0)
    with pytest.raises(OptionsError, match="got 100"):
        whisper._prepare(None, "whisper-tiny", "en", ["greedy"], hot, 1.0, 2, "mean")


def _send(demo, fn, values: list, state: SessionState) -> list:
    """One event as Gradio's server processes it for one browser session (its choices as that session's replies
    left them)."""
    return asyncio.run(demo.process_api(fn, list(values), state=state))["data"]


def test_every_target_and_drafter_switch_is_taken_even_when_its_event_arrives_twice(demo):
    """Walk every target × drafter × tree source → every other target, sending the switch twice with the values the
    page held before it (as one dropdown pick does): the second must be handled like the first, and every value the
    reply sets must be one of the choices it sets."""
    controls = {name: _block(demo, elem) for name, elem in (("model", "sl-model"), ("drafter", "sl-drafter"),
                                                          ("eagle_head", "sl-tree-source"))}
    fn = next(f for f in demo.fns.values() if (controls["model"]._id, "input") in
              [(getattr(t[0], "_id", t[0]), t[1]) for t in f.targets] and f.fn.__name__ == "adjust")
    targets = [name for _, name in model_choices()]
    switches = 0
    for start in targets:
        for drafter in drafters_for(start):
            shown = control_states(start, "speculative", drafter, "static", 0.0, None)
            sources = [value for _, value in shown["eagle_head"]["choices"]]
            for source in sources:
                for target in (t for t in targets if t != start):
                    state = SessionState(demo)
                    page = [start, "speculative", drafter, "static", 0.0, shown["draft_model"]["value"], source, "off"]
                    _send(demo, fn, page, state)  # the page as the visitor left it: the session's choices set
                    switched = [target] + page[1:]
                    first = _send(demo, fn, switched, state)
                    second = _send(demo, fn, switched, state)  # the same pick's second event, stale values
                    assert second == first, (start, drafter, source, target)
                    for name, update in zip(DEPENDENT, second):
                        if "choices" in update and update.get("value") is not None:
                            offered = [c[1] if isinstance(c, (list, tuple)) else c for c in update["choices"]]
                            assert update["value"] in offered, (start, drafter, source, target, name)
                    switches += 1
    assert switches >= len(targets) * (len(targets) - 1) * 3
