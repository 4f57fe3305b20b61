"""What a visitor and a shared host run into on the server side (issue 35 items 1-3 and 7; issue 33 item 5):
a long prompt read in chunks with a live status line and a stop within one chunk, a prompt-length cap, a Race that
stops, a hub id that fails in seconds without taking the decode slot, boxes that refuse what they cannot run, and
counts that read right in the singular. Handlers called directly, tiny random-init models."""
from __future__ import annotations

import threading
import time

import pytest

from app.shared import loading
from app.shared.decode_slot import DECODE_SLOT
from app.shared.session import RunSession
from app.tabs.generate import handlers
from app.tabs.generate.controls import TREE_CONTROLS, opening_value
from app.tabs.race import runs as race

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request just warns
LONG_PROMPT = " ".join(f"w{i % 50}" for i in range(55))  # the tiny tokenizer: about 200 tokens (context 256)


def controls(**overrides) -> list:
    values = {"prompt": "hello there", "model": "smollm2-135m", "dtype": "float32", "method": "baseline",
              "drafter": "draft-model", "draft_model": handlers.DEFAULT_DRAFT, "rule": "adaedl", "controller": "off",
              "gamma": 4, "max_draft": 6, "lam": 0.5, "ngram": 3, "skip_layers": "", "max_new_tokens": 12,
              "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "chat": False, "live": True}
    values.update({name: opening_value(name) for name in TREE_CONTROLS}, **overrides)
    return [values[name] for name in handlers.RUN_INPUTS]


def run_all(session: RunSession | None = None, **overrides) -> list[dict]:
    return list(handlers.run(*controls(**overrides), progress=lambda *a, **k: None, session=session))


@pytest.fixture
def tiny_models(monkeypatch, tiny, drafts):
    monkeypatch.setattr(loading, "load", lambda name, options, report=None: drafts["noisy"] if name == "d" else tiny)
    monkeypatch.setattr(loading, "load_draft", lambda name, options, report=None: drafts["noisy"])  # the API's draft path
    monkeypatch.setattr(loading, "check_loadable", lambda name: None)  # "d" is no model the registry knows
    from decoders.registry import uses_draft_model

    monkeypatch.setattr(loading, "draft_name", lambda o: "d" if uses_draft_model(o) else None)
    monkeypatch.setattr(handlers, "STREAM_EVERY", 0.0)  # every round drawn, however fast the machine


@pytest.fixture
def slot_held():
    """Another tab's run holding the decode slot until the test ends."""
    release, holding = threading.Event(), threading.Event()

    def hold():
        with DECODE_SLOT.hold():
            holding.set()
            release.wait(60)
    worker = threading.Thread(target=hold, daemon=True)
    worker.start()
    assert holding.wait(10)
    yield
    release.set()
    worker.join(10)


def in_thread(fn, seconds: float):
    """fn() in a thread, joined for at most `seconds`: (finished, its result)."""
    out = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    return bool(out), (out[0] if out else None)


# ---- 35.1: a long prompt ----------------------------------------------------------------------------------------

def test_a_long_prompt_says_how_far_it_has_been_read(tiny_models, monkeypatch):
    from decoders.runtime import runner

    monkeypatch.setattr(runner, "PREFILL_CHUNK", 32)
    statuses = [r.get("status", "") for r in run_all(prompt=LONG_PROMPT, method="speculative", rule="static",
                                                     max_new_tokens=4)]
    reading = [s for s in statuses if s.startswith("Reading the prompt")]
    assert reading[0].startswith("Reading the prompt: 32 of ") and "(the target; Stop ends it within one chunk)" in \
        reading[0]
    # issue 47.8: the same prompt length as "Processing the prompt (N tokens)" said, not N - 1
    processing = next(s for s in statuses if s.startswith("Processing the prompt ("))
    length = processing.split("(")[1].split(" token")[0]
    assert all(f" of {length} token" in s for s in reading), (processing, reading)
    assert any("(the draft model, after the target;" in s for s in reading)
    assert statuses[-1].startswith("Done: 4 tokens in")


def test_stop_while_the_prompt_is_read_ends_within_a_chunk(tiny_models, monkeypatch):
    from decoders.runtime import runner

    monkeypatch.setattr(runner, "PREFILL_CHUNK", 16)
    forwards = []
    monkeypatch.setattr(runner.CachedModel, "forward", _counting(runner.CachedModel.forward, forwards))
    session = RunSession()
    run = handlers.run(*controls(prompt=LONG_PROMPT), progress=lambda *a, **k: None, session=session)
    for result in run:
        if result.get("status", "").startswith("Reading the prompt: 32 of"):
            break
    session.request_stop()  # the page's Stop
    rest = list(run)
    # two chunks read when Stop came, then the one under way when the run went on: it stops after that one
    assert len(forwards) == 3 and not DECODE_SLOT.locked()
    assert rest[-1]["status"].startswith("Stopped: while reading the prompt (48 of ")


def _counting(forward, calls: list):
    def counted(self, tokens, last_only=False):
        calls.append(len(tokens))
        return forward(self, tokens, last_only)
    return counted


def test_a_prompt_over_the_cap_is_refused_before_it_waits(tiny_models, monkeypatch, slot_held):
    monkeypatch.setenv("SPECLAB_MAX_PROMPT_TOKENS", "20")
    finished, results = in_thread(lambda: run_all(prompt=LONG_PROMPT), 5)
    assert finished, "the run waited for the decode slot before refusing the prompt"
    error = results[-1]["error"]
    assert "this server reads at most 20 prompt tokens per run (SPECLAB_MAX_PROMPT_TOKENS)" in error
    assert "cut at least" in error and "Traceback" not in error


def test_the_cap_setting(monkeypatch):
    from app.shared import hosting

    monkeypatch.delenv("SPECLAB_MAX_PROMPT_TOKENS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert hosting.max_prompt_tokens() is None  # locally: no cap
    monkeypatch.setenv("SPACE_ID", "someone/speclab")
    assert hosting.max_prompt_tokens() == hosting.SPACE_MAX_PROMPT_TOKENS
    monkeypatch.setenv("SPECLAB_MAX_PROMPT_TOKENS", "0")
    assert hosting.max_prompt_tokens() is None
    monkeypatch.setenv("SPECLAB_MAX_PROMPT_TOKENS", "lots")
    assert hosting.max_prompt_tokens() == hosting.SPACE_MAX_PROMPT_TOKENS  # a bad setting: the log says so
    with pytest.raises(Exception, match="cut at least 1 token "):  # the singular
        hosting.check_prompt_length(hosting.SPACE_MAX_PROMPT_TOKENS + 1)


# ---- 35.2: the Race stops -----------------------------------------------------------------------------------------

def test_the_race_stops_inside_a_timed_run_and_keeps_what_finished(tiny_models, monkeypatch):
    from decoders.runtime.runner import CachedModel

    released, slowed = [], threading.Event()
    real_release, real_forward = CachedModel.release, CachedModel.forward_tree
    monkeypatch.setattr(CachedModel, "release", lambda self: (released.append(self), real_release(self))[1])

    def slow_forward(self, tree, hidden=False):  # the second method's rounds last long enough to be stopped in
        if slowed.is_set():
            time.sleep(0.05)
        return real_forward(self, tree, hidden)
    monkeypatch.setattr(CachedModel, "forward_tree", slow_forward)
    monkeypatch.setattr(race, "TICK", 0.1)
    values = {"prompt": "abc abc abc abc", "model": "smollm2-135m", "dtype": "float32",
              "draft_model": handlers.DEFAULT_DRAFT, "methods": ["prompt lookup · static γ=4", "layer skip · static γ=3"],
              "max_new_tokens": 200, "temperature": 0.0, "seed": 0}
    session = RunSession()
    racing = race.race(*[values[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None, session=session)
    updates = []
    for update in racing:
        updates.append(update)
        if update.get("race_status", "").startswith("Racing 3/3"):
            break  # the baseline and prompt lookup have finished; layer skip starts
    slowed.set()
    before = len(released)
    stopped_at = time.monotonic()
    stopper = threading.Thread(target=lambda: updates.append(race.stop_race(session)))
    stopper.start()
    updates.extend(racing)  # Gradio's worker draining the race
    stopper.join(10)
    assert time.monotonic() - stopped_at < 5
    line = [u["race_status"] for u in updates if isinstance(u.get("race_status"), str)][-1]
    assert line.startswith("Stopped: the baseline, speculative · prompt lookup") and "finished" in line, line
    assert "stopped at speculative · layer skip" in line and "freed its caches" in line
    assert len(released) > before and not DECODE_SLOT.locked() and not session.running
    table = [u["race_table"] for u in updates if "race_table" in u][-1]
    assert table.count("<tr>") == 3  # the header, the baseline and prompt lookup: the rows that finished


def test_stop_with_no_race_running_changes_nothing():
    import gradio as gr

    assert race.stop_race(RunSession()) == {"race_status": gr.skip(), "race_error": ""}


# ---- 35.3: a hub id that cannot load ------------------------------------------------------------------------------

def test_a_hub_id_that_cannot_load_fails_in_seconds_without_the_slot(slot_held):
    """HF_HUB_OFFLINE=1 (tests/conftest.py): the id is checked before the run waits for the slot, held here."""
    started = time.monotonic()
    finished, results = in_thread(lambda: run_all(model="nobody-here/no-such-model"), 5)
    assert finished and time.monotonic() - started < 5, "the hub id waited for the decode slot"
    error = results[-1]["error"]
    assert "cannot load &#x27;nobody-here/no-such-model&#x27;: hub access is off here (HF_HUB_OFFLINE=1)" in error
    assert "Models that work offline here: smollm2-135m" in error and "local model folder" in error


def test_an_unreachable_hub_is_known_in_seconds(tmp_path):
    """Without HF_HUB_OFFLINE, on a machine with no route to the hub: one short probe, not a minute of retries
    (transformers retried 1+2+4+8+8 s, twice). A fresh process: huggingface_hub reads its settings at import."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = ("import time\n"
              "from decoders.runtime.models import ModelError, load_model\n"
              "start = time.monotonic()\n"
              "try:\n"
              "    load_model('nobody-here/no-such-model')\n"
              "except ModelError as err:\n"
              "    print('ERROR', err)\n"
              "print('SECONDS', round(time.monotonic() - start, 1))\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT="https://speclab-test.invalid", HF_HOME=str(tmp_path))  # a name that never resolves
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parent.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    seconds = float(done.stdout.split("SECONDS")[-1])
    assert seconds < 5, done.stdout + done.stderr[-2000:]
    assert "cannot reach the Hugging Face Hub (https://speclab-test.invalid did not answer" in done.stdout


# ---- 35.7: messages -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, needle", [
    (None, "max new tokens is empty: type a whole number (for example 64)"),
    ("", "max new tokens is empty"),
    (2.5, "max new tokens must be a whole number"),
])
def test_the_max_tokens_box_refuses_what_it_cannot_run(value, needle):
    error = run_all(max_new_tokens=value)[-1]["error"]
    assert needle in error and "Traceback" not in error


def test_a_fractional_seed_is_refused_when_sampling():
    assert "seed must be a whole number" in run_all(seed=1.5, temperature=1.0)[-1]["error"]


def test_the_number_boxes_pass_what_was_typed():
    """Gradio's Number with precision 0 rounds on the server before the handler sees the value (2.5 ran as 2, seed
    1.5 as 2): the boxes keep what was typed and the handlers refuse it."""
    from app.page import build_demo

    config = build_demo().get_config_file()
    boxes = {c["props"].get("label"): c["props"] for c in config["components"] if c.get("type") == "number"}
    assert boxes["max new tokens"].get("precision") is None and boxes["seed"].get("precision") is None


def test_batch_stop_when_idle_says_nothing_runs():
    from app.tabs.batch import handlers as batch

    assert batch.stop(RunSession()) == "Nothing to stop: no batch is running in this tab."
    running = RunSession()
    running.begin()
    assert batch.stop(running).startswith("Stopping at the next round") and running.stop_requested.is_set()


def test_counts_read_right_in_the_singular(tiny):
    from decoders import DecodeOptions, generate
    from app.figures.search import growth_figure, search_headline

    trace = generate(DecodeOptions(max_new_tokens=1), [1, 2, 3], target=tiny)
    assert handlers._status(trace).startswith("Done: 1 token in 1 round (")
    search = {"method": "eagle2", "steps": 1, "stop": "depth", "frontier": [[0]], "chosen": [0],
              "pool": [{"id": 0, "parent": -1, "token": 5, "text": "x", "value": 0.5, "depth": 1, "step": 1}]}
    trace.rounds[0].search = search
    assert "grew 1 candidate in 1 step" in search_headline(trace, trace.rounds[0])
    title = growth_figure(trace, 0).layout.title.text
    assert "how the tree grew" in title and "grew grew" not in title.replace("<br>", " ") and \
        "grew to its" not in title


# ---- 33.5: every model load inside the decode slot ----------------------------------------------------------------

def test_every_model_load_happens_inside_the_decode_slot(tiny_models, monkeypatch):
    """Review 14d8f23 #8: the decode functions loaded their models before taking the slot (cache hits, mostly; a
    miss is a minute of PyTorch work beside a timed race, and a shutdown then can abort with status 134)."""
    from app.tabs.batch import handlers as batch

    inside = []
    fake = loading.load
    monkeypatch.setattr(loading, "load", lambda name, options, report=None: (inside.append(DECODE_SLOT.locked()),
                                                                             fake(name, options, report))[1])
    assert run_all(max_new_tokens=4)[-1]["state"].stop_reason == "max_new_tokens"
    list(batch.run_batch("ab ab ab\ncd cd", "smollm2-135m", "batched speculative", "prompt-lookup", 4, 0.0, ""))
    assert len(inside) == 4 and all(inside), inside  # each run: the handler's load, then the decode's own


# ---- 47.5: progress where the eye is ------------------------------------------------------------------------------

def test_the_progress_bar_counts_the_decoded_tokens_after_the_load(tiny_models):
    """The bar over the result said the load's "ready 100 %" for a whole (bf16 baseline) decode; it now counts
    tokens, up to all of them."""
    bars = []
    list(handlers.run(*controls(max_new_tokens=6), progress=lambda fraction, desc="": bars.append((fraction, desc)),
                      session=RunSession()))
    decoding = [(f, d) for f, d in bars if d.startswith("decoding with smollm2-135m: ")]
    assert decoding and decoding[-1] == (1.0, "decoding with smollm2-135m: 6 of 6 new tokens"), bars
    assert all(a[0] <= b[0] for a, b in zip(decoding, decoding[1:]))


def test_the_race_says_which_run_of_which_method_is_going(monkeypatch):
    from decoders.options import DecodeOptions

    def results(options, prompt):
        yield {"running": 0, "phase": "its warm-up"}
        yield {"running": 0, "phase": "its warm-up"}  # a second tick of the same phase: said once
        yield {"running": 0, "phase": "timed run 2 of 3"}

    bars = []
    monkeypatch.setattr(race, "race_runs", results)
    lines = [r["race_status"] for r in race._raced([DecodeOptions(), DecodeOptions(dtype="bfloat16")], "hi",
                                                   RunSession(), lambda f, desc="": bars.append((f, desc)))]
    assert lines[1:] == ["Racing 1/2: autoregressive baseline, its warm-up…",
                         "Racing 1/2: autoregressive baseline, timed run 2 of 3…"], lines
    assert [f for f, _ in bars] == [0.0, 0.25] and bars[-1][1] == lines[-1]


def test_the_whisper_status_sits_under_its_transcribe_button():
    from app.page import build_demo

    demo = build_demo()
    run = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sw-run")
    status = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sw-status")
    column = run.parent.parent  # the Run / Stop row's column
    assert status.parent is column and column.children.index(status) == column.children.index(run.parent) + 1
