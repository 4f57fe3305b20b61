"""Bad input gets a visible message, never a traceback or a hang (handlers called directly, tiny models)."""
from __future__ import annotations

import re

import json

import pytest

from app.tabs.generate import handlers

from app.tabs.race import runs as race
from app.tabs.generate.controls import TREE_CONTROLS, opening_value
from app.shared.session import RunSession
from app.tabs.generate.views import MAX_TRACE_BYTES
from app.shared.decode_slot import DECODE_SLOT
from app.shared import loading

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request just warns


def controls(**overrides) -> list:
    values = {"prompt": "hello there", "model": "smollm2-135m", "dtype": "float32", "method": "speculative",
              "drafter": "draft-model", "draft_model": handlers.DEFAULT_DRAFT, "rule": "adaedl", "controller": "off", "gamma": 4,
              "max_draft": 6, "lam": 0.5, "ngram": 3, "skip_layers": "", "max_new_tokens": 12, "temperature": 0.0,
              "top_k": 0, "top_p": 1.0, "seed": 0, "chat": True, "live": True}
    values.update({name: opening_value(name) for name in TREE_CONTROLS}, **overrides)  # the page's tree defaults
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

    monkeypatch.setattr(loading, "load", fake_load)
    monkeypatch.setattr(loading, "load_draft", fake_load)  # the draft's own path (the API's draft loader)
    monkeypatch.setattr(loading, "check_loadable", lambda name: None)  # the tiny drafts' names are no models
    from decoders.registry import uses_draft_model

    monkeypatch.setattr(loading, "draft_name", lambda o: "tiny-draft" if uses_draft_model(o) else None)


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
    error = assert_error(run_all(prompt="x" * 400), "the prompt is ", "context is 256 tokens", "cut at least")
    assert "at most 0" not in error


@pytest.mark.parametrize("tokens, needle", [(0, "max_new_tokens"), (5000, "max_new_tokens"),
                                            (2.5, "max new tokens must be a whole number")])
def test_max_tokens_out_of_range(tokens, needle):
    assert_error(run_all(max_new_tokens=tokens), needle)


def test_incompatible_options():
    assert_error(run_all(drafter="prompt-lookup", rule="adaedl"), "prompt lookup")


def test_bad_skip_layers_text():
    assert_error(run_all(drafter="layer-skip", skip_layers="9, eleven"), "comma-separated")


def test_layer_zero_cannot_be_skipped():
    assert_error(run_all(drafter="layer-skip", skip_layers="0,3"), "layer 0")


def test_out_of_range_sampling_values():
    assert_error(run_all(temperature=9.0), "temperature")
    assert_error(run_all(top_p=0.0, temperature=1.0), "top_p")


def test_controls_that_do_not_apply_are_ignored():
    """A hidden control's value (top-p under greedy, a draft model under layer skip) cannot break a run."""
    options = handlers.options_from(dict(zip(handlers.RUN_INPUTS, controls(
        top_p=0.0, temperature=0.0, drafter="layer-skip", draft_model="no-such-model", ngram=99, gamma=0))))
    assert options.top_p == 1.0 and options.draft_model is None and options.ngram == 3 and options.gamma == 4


def test_model_that_fails_to_load():
    pytest.importorskip("decoders.runtime.models")
    error = assert_error(run_all(model="no-such-model"))
    assert "no-such-model" in error


def test_load_errors_are_shown(monkeypatch):
    def broken(name, options, report=None):
        raise RuntimeError("weights are corrupt (simulated)")

    monkeypatch.setattr(loading, "load", broken)
    assert_error(run_all(method="baseline"), "weights are corrupt")  # (SmolLM2 has no draft pairing: checked first)


def test_good_run_streams_and_offers_the_trace(tiny_models):
    results = run_all(max_new_tokens=30, temperature=1.0)
    assert not any(r.get("error") for r in results)
    final = results[-1]
    assert final["state"].stop_reason == "max_new_tokens"
    assert final["download"].endswith(".json")
    assert len(final["text"]) == len(final["state"].tokens)


@pytest.fixture
def released(monkeypatch):
    """Counts CachedModel.release calls: the loop's `finally` frees the KV caches through it."""
    from decoders.runtime.runner import CachedModel

    calls = []
    original = CachedModel.release

    def spy(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(CachedModel, "release", spy)
    return calls


def first_round(run) -> object:
    for result in run:
        if "state" in result:
            return result["state"]
    raise AssertionError("the run ended before its first round")


def test_closing_the_run_frees_the_caches(tiny_models, released, monkeypatch):
    """An API client's cancel closes the run generator: the decoder's finally must run, now."""
    monkeypatch.setattr(handlers, "STREAM_EVERY", 0.0)  # a first view before the end, however fast the machine
    session = RunSession()
    run = handlers.run(*controls(max_new_tokens=200), progress=lambda *a, **k: None, session=session)
    seen = first_round(run)
    assert not seen.stop_reason and DECODE_SLOT.locked() and not released
    run.close()  # what Gradio does to a running event when Stop cancels it
    assert len(released) == 2 and not DECODE_SLOT.locked()  # the target's and the draft's caches
    assert not session.running and session.idle.is_set()
    views = handlers.stop(seen, session)
    assert views["state"].stop_reason == "cancelled" and views["status"].startswith("Stopped")
    assert views["download"].endswith(".json") and len(views["state"].output_ids) < 200


def test_stop_while_queued_says_the_queued_run_was_cancelled():
    """The run was accepted into the queue (Gradio called admit) but never began: Stop says so."""
    session = RunSession()
    handlers.admit(session)
    assert handlers.stop(None, session)["status"] == "Cancelled your queued run; nothing had started."
    assert handlers.stop(None, session)["status"].startswith("Nothing to stop")  # said once, not forever


def test_stop_after_the_run_finished(tiny_models):
    session = RunSession()
    handlers.admit(session)
    results = list(handlers.run(*controls(max_new_tokens=8), progress=lambda *a, **k: None, session=session))
    assert results[-1]["state"].stop_reason == "max_new_tokens"
    assert handlers.stop(results[-1]["state"], session)["status"] == \
        "Nothing to stop: the last run had already finished."


def test_stop_waits_for_the_run_to_close_and_shows_its_last_round(tiny_models, monkeypatch):
    """Stop can start while Gradio is still closing the run: it waits, then shows the partial trace."""
    import threading

    monkeypatch.setattr(handlers, "STREAM_EVERY", 0.0)
    session = RunSession()
    run = handlers.run(*controls(max_new_tokens=200), progress=lambda *a, **k: None, session=session)
    first_round(run)
    closer = threading.Timer(0.3, run.close)  # Gradio's cancel arriving a moment after the Stop handler began
    closer.start()
    views = handlers.stop(None, session)
    closer.join()
    assert views["state"].stop_reason == "cancelled" and views["status"].startswith("Stopped")
    assert not DECODE_SLOT.locked()


def test_stop_from_the_page_ends_a_running_run_that_nobody_closes(tiny_models, monkeypatch):
    """The page's Stop reaches the run only through the session (Gradio 6.31's page posts no /cancel): the run,
    still iterated by Gradio's worker, returns at its next round and Stop shows it stopped."""
    import threading

    monkeypatch.setattr(handlers, "STREAM_EVERY", 0.0)
    session = RunSession()
    handlers.admit(session)
    seen = []
    run = handlers.run(*controls(max_new_tokens=200), progress=lambda *a, **k: None, session=session)
    first_round(run)
    worker = threading.Thread(target=lambda: seen.extend(run))  # Gradio's worker draining the generator
    worker.start()
    views = handlers.stop(None, session)
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert views["state"].stop_reason == "cancelled" and views["status"].startswith("Stopped")
    assert len(views["state"].output_ids) < 200 and not DECODE_SLOT.locked()
    shown = [r["state"] for r in seen if r.get("state")]
    assert shown[-1].stop_reason == "cancelled"  # the run's own last view says it stopped (Stop may give up waiting)
    assert not any(t.stop_reason for t in shown[:-1])


def test_a_run_that_begins_after_a_stop_in_the_queue_does_not_decode(tiny_models):
    session = RunSession()
    handlers.admit(session)
    assert handlers.stop(None, session)["status"] == "Cancelled your queued run; nothing had started."
    skipped = list(handlers.run(*controls(max_new_tokens=8), progress=lambda *a, **k: None, session=session))
    assert len(skipped) == 1 and skipped[0]["status"].startswith("Cancelled: Stop was pressed while this run waited")
    handlers.admit(session)  # the next Run is not affected
    results = list(handlers.run(*controls(max_new_tokens=8), progress=lambda *a, **k: None, session=session))
    assert results[-1]["state"].stop_reason == "max_new_tokens"


def test_run_without_live_drawing_still_hands_gradio_updates(tiny_models, monkeypatch):
    """With live drawing off the run yields no-op updates, so Gradio can close it between them (Stop)."""
    monkeypatch.setattr(handlers, "STOP_POLL", 0.0)
    results = run_all(max_new_tokens=30, live=False)
    assert {} in results and results[-1]["state"].stop_reason == "max_new_tokens"


@pytest.mark.parametrize("content, needle", [
    (b"this is not json", "not valid JSON"),
    (b'{"schema_version": 1}', "missing field"),
    (b'{"schema_version": 99}', "schema version"),
    (b"[1, 2, 3]", "JSON object"),
    (b'{"foo": 1}', "not a SpecLab trace"),
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


def test_replay_status_uses_the_right_article(tmp_path, tiny_models):
    final = run_all(max_new_tokens=6)[-1]
    assert handlers.load_trace(final["download"])["status"].startswith("Replaying an uploaded trace")
    assert handlers.load_trace(final["download"], "recorded")["status"].startswith("Replaying a recorded trace")


def test_trace_file_too_large(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        handle.truncate(MAX_TRACE_BYTES + 1)
    assert "MB" in handlers.load_trace(str(path))["error"]


def test_good_trace_file_round_trips(tmp_path, tiny_models):
    final = run_all(max_new_tokens=10)[-1]
    result = handlers.load_trace(final["download"])
    assert result["state"].output_ids == final["state"].output_ids and not result["error"]


def test_a_live_tree_run_on_the_shipped_head_streams_tree_views():
    """The Run handler end to end on the real SmolLM2 and its shipped EAGLE head: options from the page's tree
    controls, load, decode, and a finished view whose tree shows the search (the page's opening settings)."""
    results = list(handlers.run(*controls(model="smollm2-135m", drafter="eagle2", eagle_head="auto", tree_m=20,
                                          max_new_tokens=10, prompt="Name three colours of the rainbow."),
                                progress=lambda *a, **k: None))
    final = results[-1]
    assert not final.get("error"), final.get("error")
    assert final["status"].startswith("Done") and final["state"].rounds[0].search["pool"]
    assert "EAGLE-2 grew" in final["tree"].layout.title.text.replace("<br>", " ")
    assert "how the tree grew" in final["positions"].layout.title.text


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
              "methods": ["prompt lookup · static γ=4", "draft model · AdaEDL · cost-aware cap"], "max_new_tokens": 16,
              "temperature": 0.0, "seed": 0}
    results = list(race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))
    final = results[-1]
    assert not final.get("race_error")
    assert final["race_table"].count("<tr>") == 4  # header + baseline + 2 methods
    assert final["race_table"].count(">yes</td>") == 2  # greedy float32: both identical to the baseline
    status = final["race_status"]
    assert f"median of {race.TIMED_RUNS} timed runs" in status and "temperature 0 (greedy)" in status
    assert "“abcabcabcabc”" in status and "float32" in status


def race_tiny(methods: list[str], temperature: float = 0.0) -> dict:
    values = {"prompt": "abcabcabcabc", "model": "tiny", "dtype": "float32", "draft_model": handlers.DEFAULT_DRAFT,
              "methods": methods, "max_new_tokens": 16, "temperature": temperature, "seed": 0}
    return list(race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))[-1]


def test_race_runs_trees_losslessly_and_counts_their_draft_forwards(tiny_models):
    final = race_tiny(["EAGLE-2 tree · draft model · cost-aware", "DDD tree · draft model (paper: M59, checks at 5,7,9)"])
    assert not final.get("race_error")
    assert final["race_table"].count(">yes</td>") == 2  # greedy float32 trees equal the baseline
    assert final["race_verdicts"].count("draft forwards") == 2
    assert len(re.findall(r"<td>[\d.]+ [KM]iB</td>", final["race_table"])) == 3  # every row states its KV memory


def test_race_puts_beam_methods_memory_next_to_their_speed(tiny_models):
    final = race_tiny(["beam sampling · width 4 (temperature > 0)", "DSBD · width 4 (temperature > 0)"], 1.0)
    assert not final.get("race_error"), final.get("race_error")
    table = final["race_table"]
    assert table.count("n/a (searches for another output)") == 2
    memory = [float(m) * {"K": 1, "M": 1024}[unit] for m, unit in re.findall(r"<td>([\d.]+) ([KM])iB</td>", table)]
    assert len(memory) == 3 and min(memory[1:]) > memory[0]  # four beams hold more cache than one sequence
    assert final["race_verdicts"].count("up to 4 rows") == 2


def test_race_refuses_beam_search_while_sampling_with_the_fix():
    final = race_tiny(["beam search · width 4 (temperature 0)"], 0.7)
    assert "set temperature 0" in final["race_error"] and "Traceback" not in final["race_error"]


def test_race_times_each_method_several_times_and_shows_the_median_and_range(tiny_models, monkeypatch):
    import decoders.api

    calls = []
    real = decoders.api.stream
    monkeypatch.setattr(decoders.api, "stream", lambda *a, **k: (calls.append(a[0].max_new_tokens), real(*a, **k))[1])
    values = {"prompt": "abcabcabcabc", "model": "tiny", "dtype": "float32", "draft_model": handlers.DEFAULT_DRAFT,
              "methods": ["prompt lookup · static γ=4"], "max_new_tokens": 16, "temperature": 0.0, "seed": 0}
    final = list(race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))[-1]
    assert calls == ([race.WARMUP_TOKENS] + [16] * race.TIMED_RUNS) * 2  # baseline, then the method
    rows = final["race_table"].split("<tr>")[2:]
    assert len(rows) == 2 and all(re.search(r"<td>[\d.]+ \([\d.]+–[\d.]+\)</td>", row) for row in rows)


def test_model_loading_progress_is_forwarded(monkeypatch):
    """decoders.runtime.models.load_model reports progress as strings; the handler turns them into a moving bar."""
    models = pytest.importorskip("decoders.runtime.models")
    seen = []

    def fake_load_model(name, dtype="auto", device="auto", progress=None):
        progress("converting model.gguf to float32 safetensors (first load only, up to a minute)…")
        progress("saving converted copy to /tmp/x…")
        progress("something new")
        progress("ready (gguf)")
        return object()

    monkeypatch.setattr(models, "load_model", fake_load_model)
    options = handlers.options_from({"model": "smollm2-135m", "method": "baseline"})
    loading.load("smollm2-135m", options, lambda fraction, message: seen.append((fraction, message)))
    assert [f for f, _ in seen] == [0.2, 0.8, None, 1.0]  # None: an unknown step shows a spinner
    assert seen[-1][1] == "smollm2-135m: ready (gguf)"


def test_a_loader_fraction_wins_over_the_phase_table(monkeypatch):
    models = pytest.importorskip("decoders.runtime.models")
    seen = []
    monkeypatch.setattr(models, "load_model", lambda name, dtype, device, progress: progress(0.42, "converting"))
    loading.load("smollm2-135m", handlers.options_from({}), lambda fraction, message: seen.append(fraction))
    assert seen == [0.42]


def test_the_prompt_phase_is_announced_with_its_token_count(tiny_models):
    results = run_all(prompt="abcdefgh", chat=False, max_new_tokens=4, method="baseline")
    statuses = [r.get("status", "") for r in results]
    phase = next(i for i, s in enumerate(statuses) if s.startswith("Processing the prompt (8 tokens)"))
    first_round_at = next(i for i, r in enumerate(results) if "state" in r)
    assert phase < first_round_at and "float32" in statuses[phase]
    assert "(float32)" in results[-1]["status"]  # the dtype the run used, next to its result


def test_finished_runs_say_which_dtype_and_why(tiny_models, monkeypatch):
    """Generate's status and the Race's say the dtype a run used, and for dtype auto the loader's reason."""
    import torch

    models = pytest.importorskip("decoders.runtime.models")
    from decoders.runtime.dtype_choice import DtypeDecision

    monkeypatch.setattr(models, "dtype_decision", lambda device="auto": DtypeDecision(torch.float32, "a test said so"))
    final = run_all(dtype="auto", max_new_tokens=6)[-1]
    assert "(float32: auto chose it because a test said so)" in final["status"]
    assert "because" not in run_all(dtype="float32", max_new_tokens=6)[-1]["status"]
    values = {"prompt": "abcabc", "model": "tiny", "dtype": "auto", "draft_model": handlers.DEFAULT_DRAFT,
              "methods": ["prompt lookup · static γ=4"], "max_new_tokens": 6, "temperature": 0.0, "seed": 0}
    raced = list(race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))[-1]
    assert " · float32: auto chose it because a test said so · " in raced["race_status"]
