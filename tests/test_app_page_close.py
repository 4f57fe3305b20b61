"""Issue 47.5: closing a page stops what it started. Its runs stop as Stop stops them (Gradio's unload, app/page.py),
and a model load stops at its next step (app/shared/loading.py) instead of running to its end, a first conversion
included, while the next visitor waits behind it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.shared import loading
from app.shared.decode_slot import DECODE_SLOT
from app.shared.session import RunSession, stop_runs_of_page
from decoders.options import DecodeOptions

STEPS = ("loading from cache…", "converting x.gguf to float32 safetensors…", "saving converted copy…",
         "moving to cpu…", "float32 matmuls packed", "ready (converted)")


class SlowLoader:
    """decoders.models' shape: load_model reports each step through its progress callback, as the real one does."""

    def __init__(self, on_step=lambda step: None):
        self.reached, self.on_step = [], on_step

    def load_model(self, name, dtype, device, progress):
        for step in STEPS:
            progress(step)
            self.reached.append(step)
            self.on_step(step)
        return SimpleNamespace(name=name)

    def hold(self, *models):
        import contextlib
        return contextlib.nullcontext()


def test_a_load_stops_at_its_next_step_once_its_run_is_stopped(monkeypatch):
    session = RunSession()
    assert session.begin()
    loader = SlowLoader(on_step=lambda step: step.startswith("converting") and session.request_stop())
    monkeypatch.setattr(loading, "_models_module", lambda: loader)
    monkeypatch.setattr(loading, "draft_name", lambda options: None)
    with pytest.raises(loading.LoadCancelled, match="Stopped while loading the model"):
        with loading.loaded(DecodeOptions(model="m"), stop=session.stop_requested.is_set):
            pytest.fail("the run went on after its page stopped it")
    assert loader.reached == list(STEPS[:2])  # conversion done, nothing after it
    assert DECODE_SLOT.holder() is None  # the next visitor's run is not kept waiting
    loader = SlowLoader()
    monkeypatch.setattr(loading, "_models_module", lambda: loader)
    with loading.loaded(DecodeOptions(model="m"), stop=lambda: False) as pairs:  # not stopped: loads to the end
        assert pairs[0][0].name == "m" and loader.reached == list(STEPS)


def test_closing_a_page_stops_the_runs_of_its_tabs_and_no_other_page_s():
    def page(*values):
        return SimpleNamespace(state_data=dict(enumerate(values)))

    mine, queued, idle, theirs = RunSession(), RunSession(), RunSession(), RunSession()
    mine.begin(), queued.admit(), theirs.begin()
    demo = SimpleNamespace(server_app=SimpleNamespace(state_holder=SimpleNamespace(session_data={
        "mine": page(mine, queued, idle, "another state"), "theirs": page(theirs)})))
    assert stop_runs_of_page(demo, "mine") == 2
    assert mine.stop_requested.is_set() and queued.skip == 1 and not idle.stop_requested.is_set()
    assert not theirs.stop_requested.is_set()
    assert stop_runs_of_page(demo, "gone") == 0 and stop_runs_of_page(SimpleNamespace(), "mine") == 0


def test_the_page_stops_its_runs_when_it_unloads():
    from app.page import build_demo

    demo = build_demo()
    unload = [fn for fn in demo.fns.values() if any(target[1] == "unload" for target in fn.targets)]
    assert len(unload) == 1 and unload[0].fn.__name__ == "page_closed"
