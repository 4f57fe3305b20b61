"""Bad input gets a visible message, never a traceback or a hang (handlers called directly, tiny models)."""
from __future__ import annotations

import json

import pytest

from app import handlers, race
from app.views import MAX_TRACE_BYTES

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request just warns


def controls(**overrides) -> list:
    values = {"prompt": "hello there", "model": "smollm2-135m", "dtype": "float32", "method": "speculative",
              "drafter": "draft-model", "draft_model": handlers.DEFAULT_DRAFT, "rule": "adaedl", "gamma": 4,
              "max_draft": 6, "lam": 0.5, "ngram": 3, "skip_layers": "", "max_new_tokens": 12, "temperature": 0.0,
              "top_k": 0, "top_p": 1.0, "seed": 0, "chat": True, "live": True}
    values.update(overrides)
    return [values[name] for name in handlers.RUN_INPUTS]


def run_all(**overrides) -> list[dict]:
    return list(handlers.run(*controls(**overrides), progress=lambda *a, **k: None))


@pytest.fixture
def tiny_models(monkeypatch, tiny, drafts):
    """Route model loading to tiny random models (context 256) so these tests need no weights."""
    def fake_load(name, options, report=None):
        if report:
            report(0.5, f"{name}: loading")
        return drafts["noisy"] if name == "tiny-draft" else tiny

    monkeypatch.setattr(handlers, "load", fake_load)
    monkeypatch.setattr(handlers, "draft_name", lambda o: "tiny-draft" if o.drafter == "draft-model" and
                        o.method == "speculative" else None)


def assert_error(results: list[dict], *needles: str) -> str:
    last = results[-1]
    assert "error" in last and last["error"], f"no visible error in {last}"
    for needle in needles:
        assert needle in last["error"], f"{needle!r} not in {last['error']!r}"
    assert "Traceback" not in last["error"]
    return last["error"]


def test_empty_prompt():
    assert_error(run_all(prompt="   "), "prompt is empty")


def test_prompt_longer_than_the_context(tiny_models):
    assert_error(run_all(prompt="x" * 400), "exceeds", "context")


@pytest.mark.parametrize("tokens", [0, 5000, 2.5])
def test_max_tokens_out_of_range(tokens):
    assert_error(run_all(max_new_tokens=tokens), "max_new_tokens")


def test_incompatible_options():
    assert_error(run_all(drafter="prompt-lookup", rule="adaedl"), "prompt lookup")


def test_bad_skip_layers_text():
    assert_error(run_all(drafter="layer-skip", skip_layers="9, eleven"), "comma-separated")


def test_layer_zero_cannot_be_skipped():
    assert_error(run_all(drafter="layer-skip", skip_layers="0,3"), "layer 0")


def test_out_of_range_sampling_values():
    assert_error(run_all(temperature=9.0), "temperature")
    assert_error(run_all(top_p=0.0), "top_p")


def test_model_that_fails_to_load():
    pytest.importorskip("decoders.models")
    error = assert_error(run_all(model="no-such-model"))
    assert "no-such-model" in error


def test_load_errors_are_shown(monkeypatch):
    def broken(name, options, report=None):
        raise RuntimeError("weights are corrupt (simulated)")

    monkeypatch.setattr(handlers, "load", broken)
    assert_error(run_all(), "weights are corrupt")


def test_good_run_streams_and_offers_the_trace(tiny_models):
    results = run_all(max_new_tokens=30, temperature=1.0)
    assert not any(r.get("error") for r in results)
    final = results[-1]
    assert final["state"].stop_reason == "max_new_tokens"
    assert final["download"].endswith(".json")
    assert len(final["text"]) == len(final["state"].tokens)


def test_stop_closes_the_decoder(tiny_models):
    run = handlers.run(*controls(max_new_tokens=200, live=True), progress=lambda *a, **k: None)
    seen = None
    for result in run:
        if "state" in result:
            seen = result["state"]
            break
    assert seen is not None and not seen.stop_reason
    assert handlers.DECODE_LOCK.locked()  # still decoding
    run.close()  # what Gradio does when Stop cancels the event
    assert not handlers.DECODE_LOCK.locked()  # the decode generator's finally ran
    views = handlers.stop(seen)
    assert views["state"].stop_reason == "cancelled" and "Stopped" in views["status"]


def test_stop_button_flags_the_run_which_shows_the_partial_trace(tiny_models, monkeypatch):
    """Stop during a live run (as the browser does): the run closes the decoder and its last view says so."""
    import threading

    monkeypatch.setattr(handlers, "STREAM_EVERY", 0.0)  # an update every round: tiny models finish in a blink

    outputs, started = [], threading.Event()

    def consume():
        for result in handlers.run(*controls(max_new_tokens=200), progress=lambda *a, **k: None, session="s1"):
            outputs.append(result)
            if "state" in result:
                started.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert started.wait(60)
    views = handlers.stop(None, session="s1")
    worker.join(30)
    assert not worker.is_alive() and not handlers.DECODE_LOCK.locked()
    assert outputs[-1]["state"].stop_reason == "cancelled" and outputs[-1]["status"].startswith("Stopped")
    assert views["state"].stop_reason == "cancelled" and views["download"].endswith(".json")
    assert len(views["state"].output_ids) < 200


@pytest.mark.parametrize("content, needle", [
    (b"this is not json", "not valid JSON"),
    (b'{"schema_version": 1}', "missing field"),
    (b'{"schema_version": 99}', "schema version"),
    (b"[1, 2, 3]", "JSON object"),
    (b"\xff\xfe\x00binary", "UTF-8"),
])
def test_malformed_trace_file(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    result = handlers.load_trace(str(path))
    assert needle in result["error"] and "state" not in result  # the current trace stays


def test_trace_with_wrong_value_types(tmp_path, tiny_models):
    final = run_all(max_new_tokens=8)[-1]
    data = json.loads(final["state"].to_json())
    data["rounds"][0]["nodes"] = "not a list"
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(data))
    assert "error" in handlers.load_trace(str(path))


def test_trace_file_too_large(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        handle.truncate(MAX_TRACE_BYTES + 1)
    assert "MB" in handlers.load_trace(str(path))["error"]


def test_good_trace_file_round_trips(tmp_path, tiny_models):
    final = run_all(max_new_tokens=10)[-1]
    result = handlers.load_trace(final["download"])
    assert result["state"].output_ids == final["state"].output_ids and not result["error"]


def test_race_bad_inputs():
    def race_all(**over):
        values = {"prompt": "hi", "model": "smollm2-135m", "dtype": "float32", "draft_model": handlers.DEFAULT_DRAFT,
                  "methods": ["prompt lookup · static γ=4"], "max_new_tokens": 8, "temperature": 0.0, "seed": 0}
        values.update(over)
        return list(race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))

    assert "prompt is empty" in race_all(prompt="")[-1]["race_error"]
    assert "at most 3" in race_all(methods=list(race.PRESETS)[:4])[-1]["race_error"]
    assert "at least one" in race_all(methods=[])[-1]["race_error"]
    assert "max_new_tokens" in race_all(max_new_tokens=0)[-1]["race_error"]


def test_race_runs_on_tiny_models(tiny_models):
    values = {"prompt": "abcabcabcabc", "model": "tiny", "dtype": "float32", "draft_model": handlers.DEFAULT_DRAFT,
              "methods": ["prompt lookup · static γ=4", "draft model · AdaEDL"], "max_new_tokens": 16,
              "temperature": 0.0, "seed": 0}
    results = list(race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))
    final = results[-1]
    assert not final.get("race_error")
    assert final["race_table"].count("<tr>") == 4  # header + baseline + 2 methods
    assert "yes" in final["race_table"]  # greedy float32: identical to the baseline


def test_model_loading_progress_is_forwarded(monkeypatch):
    """decoders.models.load_model reports progress as strings; the handler turns them into progress updates."""
    models = pytest.importorskip("decoders.models")
    seen = []

    def fake_load_model(name, dtype="auto", device="auto", progress=None):
        progress("converting weights…")
        progress("ready")
        return object()

    monkeypatch.setattr(models, "load_model", fake_load_model)
    options = handlers.options_from({"model": "smollm2-135m", "method": "baseline"})
    handlers.load("smollm2-135m", options, lambda fraction, message: seen.append((fraction, message)))
    assert seen == [(None, "smollm2-135m: converting weights…"), (None, "smollm2-135m: ready")]
