"""The Beams tab's handlers without a browser, on tiny random models (tests/tiny.py): a beam run streams drawn
iterations, Stop ends a running one (and its trace says so), bad input gives a one-line message."""
from __future__ import annotations

import pytest

from app.tabs import beams as beams_tab

from app.shared import loading
from app.shared.session import RunSession
from decoders.beams.trace import BeamTrace

MEMORY = next(iter(beams_tab.MEMORY_MODES))


@pytest.fixture
def tiny_models(monkeypatch, tiny, drafts):
    """Every model name loads a tiny random model (the draft: a noisy copy of the target)."""
    loaded = []

    def fake_load(name, options, report=None):
        loaded.append(name)
        return drafts["noisy"] if name == "tiny-draft" else tiny

    monkeypatch.setattr(loading, "load", fake_load)
    monkeypatch.setattr(loading, "draft_name", lambda o: "tiny-draft" if o.method == "dsbd" else None)
    monkeypatch.setattr(beams_tab, "STREAM_EVERY", 0.0)  # every iteration drawn, however fast the machine
    return loaded


def beams(method="dsbd", max_tokens=12, width=3, session=None, prompt="hello", **over):
    args = dict(model="tiny", draft=beams_tab.SAME_AS_PAIRING, method=method, width=width, gamma=3, thres=0.7,
                min_width=1, memory=MEMORY, max_tokens=max_tokens, seed=0)
    args.update(over)
    return beams_tab.run_beams(prompt, session=session, **args)


@pytest.mark.parametrize("method", ["beam-search", "beam-sampling", "dsbd"])
def test_a_beam_run_streams_drawn_iterations(tiny_models, method):
    results = list(beams(method))
    drawn = [r for r in results if r.get("forest") is not None and not isinstance(r["forest"], dict)]
    assert len(drawn) >= 2, "expected the forest drawn more than once while the run streamed"
    final = BeamTrace.from_dict(results[-1]["trace"])
    assert final.method == method and final.stop_reason in ("eos", "max_new_tokens") and final.candidates
    assert results[-1]["error"] == "" and final.label in results[-1]["status"]
    marker_names = {t.name for t in results[-1]["forest"].data if t.mode == "markers+text"}
    assert "accepted" in marker_names and "input beam" in marker_names
    bars = [t for t in results[-1]["width"].data if t.type == "bar"]
    assert bool(bars) == (method == "dsbd")
    assert ("tiny-draft" in tiny_models) == (method == "dsbd")


def test_stop_ends_a_running_beam_run(tiny_models):
    session = RunSession()
    run = beams("beam-sampling", max_tokens=200, session=session)
    first = None
    for result in run:
        if "schema_version" in result.get("trace", {}):  # a drawn iteration (gr.skip() is a plain dict too)
            first = BeamTrace.from_dict(result["trace"])
            break
    assert first is not None and session.running
    assert beams_tab.stop(session)["status"].startswith("Stopping")
    rest = list(run)
    assert rest and rest[-1]["status"].startswith("Stopped")
    stopped = BeamTrace.from_dict(rest[-1]["trace"])
    assert stopped.stop_reason == "cancelled" and len(stopped.iterations) < 200
    assert not session.running and session.idle.is_set()


def test_scrubbing_redraws_an_earlier_iteration(tiny_models):
    final = list(beams("dsbd"))[-1]["trace"]
    views = beams_tab.show_iteration(final, 1)
    assert "iteration 1 of" in views["forest"].layout.title.text


def test_a_one_iteration_run_gives_a_slider_gradio_accepts(tiny_models):
    final = list(beams("beam-search", max_tokens=1))[-1]
    slider = final["iteration"]
    assert BeamTrace.from_dict(final["trace"]).totals["iterations"] == 1
    assert slider["minimum"] < slider["maximum"] and slider["visible"] is False  # Gradio: minimum < maximum


@pytest.mark.parametrize("over, needle", [
    (dict(prompt="  "), "Type a prompt"),
    (dict(width="two"), "whole numbers"),
    (dict(thres=1.5), "thres must be in (0, 1]"),
    (dict(method="greedy"), "method must be one of"),
    (dict(min_width=5, width=3), "min_width"),
])
def test_bad_input_gives_a_message(tiny_models, over, needle):
    results = list(beams(**over))
    assert len(results) == 1 and needle in results[0]["error"]
    assert not tiny_models, "nothing should load for bad input"


def test_dsbd_without_a_paired_draft_says_where_to_choose_one(monkeypatch):
    results = list(beams_tab.run_beams("hi", "smollm2-135m", beams_tab.SAME_AS_PAIRING, "dsbd", 3, 3, 0.7, 1, MEMORY,
                                       8, 0))
    assert "no default draft model" in results[0]["error"] and "Draft model (DSBD)" in results[0]["error"]
