"""Every click computes once: each event of the built page calls its decoder or renderer once, however many
output components it fills (issue 24: the round slider rendered its round once per output, 4x per move)."""
from __future__ import annotations

import contextlib

import gradio as gr
import pytest

from app_fakes import fake_loaded
from app.page import build_demo
from app.shared.session import RunSession
from app.shared.paths import ASSETS
from app.tabs.generate import handlers, views
from app.tabs.race import runs as race

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def events() -> dict:
    """api_name -> the function Gradio calls for that event on the built page."""
    demo = build_demo()
    return {block_fn.api_name: block_fn.fn for block_fn in demo.fns.values()}


@pytest.fixture
def trace():
    return views.read_trace_file(ASSETS / "traces" / "eagle2-head-chat.json")


class Counter:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def renders(monkeypatch) -> dict[str, Counter]:
    """Count the Generate tab's two renderers (one round's views; every view of a trace)."""
    counters = {"round_views": Counter(handlers.round_views), "full_views": Counter(handlers.full_views)}
    for name, counter in counters.items():
        monkeypatch.setattr(handlers, name, counter)
    return counters


def test_the_round_slider_renders_its_round_once_per_move(events, trace, renders):
    result = events["show_round"](trace, 3)
    assert len(result) == len(views.ROUND_OUTPUTS)
    assert renders["round_views"].calls == 1, f"one slider move rendered {renders['round_views'].calls} times"


def test_clicking_a_token_renders_once(events, trace, renders):
    span = next(i for i, (_, kind) in enumerate(handlers.full_views(trace)["text"]) if kind)
    renders["full_views"].calls = 0
    event = gr.SelectData(None, {"index": span, "value": "x", "selected": True})
    result = events["select_token"](trace, event)
    assert len(result) == len(views.ROUND_OUTPUTS) + 1
    assert renders["round_views"].calls == 1


def test_loading_a_recorded_run_renders_once(events, renders):
    recorded = views.recorded_traces(ASSETS / "traces")
    result = events["load_recorded"](next(iter(recorded)))
    assert len(result) == len(views.OUTPUTS)
    assert renders["full_views"].calls == 1


def test_run_decodes_once_per_click(events, monkeypatch, trace):
    """Run streams one decode: the decoder generator is started once, and every update is drawn once."""
    started = []

    def fake_decode(options, prompt, every, store=None):
        started.append(prompt)
        yield trace.to_dict()

    monkeypatch.setattr(handlers, "decode_rounds", fake_decode)
    monkeypatch.setattr(handlers, "loaded", fake_loaded)
    drawn = Counter(handlers.full_views)
    monkeypatch.setattr(handlers, "full_views", drawn)
    values = {name: None for name in handlers.RUN_INPUTS}
    values.update(prompt="hello", model="smollm2-135m", method="baseline", live=True, max_new_tokens=8)
    args = [values[name] for name in handlers.RUN_INPUTS] + [None, None, lambda *a, **k: None]
    updates = list(events["run"](*args))
    assert started == ["hello"], f"the decoder started {len(started)} times for one click"
    assert drawn.calls == 1  # one streamed trace, drawn once for all twelve outputs
    assert all(len(update) == len(views.OUTPUTS) for update in updates)


def test_race_runs_each_method_once_per_click(events, monkeypatch, trace):
    calls = []

    def fake_race_runs(options, prompt):
        calls.append(len(options))
        for _ in options:
            yield trace.to_dict()

    @contextlib.contextmanager
    def fake_loaded(*runs, report=None, turn=None, stop=None):
        yield []

    monkeypatch.setattr(race, "race_runs", fake_race_runs)
    monkeypatch.setattr(race, "loaded", fake_loaded)
    args = ["hello", "smollm2-135m", "float32", None, ["prompt lookup · static γ=4"], 16, 0.0, 0]
    list(events["race"](*args, RunSession(), None, lambda *a, **k: None))  # (inputs..., session, request, progress)
    assert calls == [2], f"one Race click raced {calls}"


def test_handled_errors_reach_the_server_log(caplog):
    """The page shows one sentence; the server log gets it too, and an unexpected error's traceback."""
    import logging

    from app.shared.errors import log_handled

    values = {name: None for name in handlers.RUN_INPUTS}
    values.update(prompt="hello", model="smollm2-135m", method="baseline", max_new_tokens=0)
    with caplog.at_level(logging.WARNING, logger="speclab.app"):
        updates = list(handlers.run(*(values[n] for n in handlers.RUN_INPUTS), progress=lambda *a, **k: None))
        race_updates = list(race.race("hi", "smollm2-135m", "auto", None, [], 16, 0.0, 0,
                                      progress=lambda *a, **k: None))
        try:
            raise KeyError("boom")
        except KeyError as err:
            log_handled("Generate", "Unexpected error (KeyError): 'boom'", err, unexpected=True)
    assert "at least 1 new token" in updates[-1]["error"] and "pick at least one method" in \
        race_updates[-1]["race_error"]
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "speclab.app"]
    assert any(level == "WARNING" and text.startswith("Generate: max_new_tokens must be") and "at least 1" in text
               for level, text in logged)
    assert any(level == "WARNING" and text.startswith("Race: pick at least one method") for level, text in logged)
    unexpected = [r for r in caplog.records if r.levelname == "ERROR"]
    assert unexpected and unexpected[0].exc_info and "KeyError" in caplog.text
