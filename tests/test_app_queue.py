"""Stop through the real queue (gradio_client, two visitors): a run waiting for its turn says what it waits for and
Stop gives its place up; a running one is closed and its caches freed. Tiny random-init models, slowed down so one run outlasts the other's request."""
from __future__ import annotations

import time

import pytest

from app.shared import loading
from app.tabs.generate import handlers
from app.tabs.generate.controls import TREE_CONTROLS, opening_value

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
from app_server import launched_demo  # noqa: E402
from app.shared.decode_slot import DECODE_SLOT

ROUND_SECONDS = 0.08  # each target forward sleeps this long: 200 tokens take ~16 s (the tiny context is 256)


@pytest.fixture(scope="module")
def slow_tiny():
    from tiny import tiny_llama

    lm = tiny_llama(layers=2)
    lm.model.register_forward_pre_hook(lambda module, args: time.sleep(ROUND_SECONDS))
    return lm


@pytest.fixture(scope="module")
def released():
    """Every CachedModel.release call (the decoder's `finally` frees its KV caches through it)."""
    from decoders.runtime.runner import CachedModel

    calls = []
    original = CachedModel.release
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CachedModel, "release", lambda self: (calls.append(self), original(self))[1])
        yield calls


@pytest.fixture(scope="module")
def server(slow_tiny, released):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading, "load", lambda name, options, report=None: slow_tiny)
        patch.setattr(loading, "draft_name", lambda options: None)
        with launched_demo() as url:
            yield url


def controls(**overrides) -> list:
    values = {"prompt": "hello there", "model": "smollm2-135m", "dtype": "float32", "method": "baseline",
              "drafter": "layer-skip", "draft_model": None, "rule": "adaedl", "controller": "off", "gamma": 4, "max_draft": 6,
              "lam": 0.5, "ngram": 3, "skip_layers": "", "max_new_tokens": 200, "temperature": 0.0, "top_k": 0,
              "top_p": 1.0, "seed": 0, "chat": False, "live": True}
    values.update({name: opening_value(name) for name in TREE_CONTROLS}, **overrides)  # the page's tree defaults
    return [values[name] for name in handlers.RUN_INPUTS]


def wait_for(condition, seconds: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def has_rounds(job) -> bool:
    return any(isinstance(out, (list, tuple)) and len(out) > 2 and isinstance(out[2], list) and out[2]
               for out in job.outputs())


def statuses(job) -> list[str]:
    return [out[0] for out in job.outputs() if isinstance(out, (list, tuple)) and out and isinstance(out[0], str)]


def test_a_waiting_run_says_what_it_waits_for_and_stop_ends_either_run(server, released):
    """Issue 35 item 1: a run that waits behind another visitor's says so, with how long that one has run (it used to
    wait in Gradio's queue under a stale status line); Stop gives its place up, and closes a running run."""
    from gradio_client import Client
    from gradio_client.utils import Status

    first, second = Client(server, verbose=False), Client(server, verbose=False)
    running = first.submit(*controls(), api_name="/run")
    wait_for(lambda: has_rounds(running), what="the first visitor's run to stream rounds")
    waiting = second.submit(*controls(), api_name="/run")
    wait_for(lambda: any(s.startswith("Waiting for your turn") for s in statuses(waiting)),
             what="the second run to say what it waits for")
    line = next(s for s in statuses(waiting) if s.startswith("Waiting for your turn"))
    assert "a Generate run (smollm2-135m) has been running for" in line and "Stop gives up your place" in line

    said = second.predict(api_name="/stop")
    assert said[0].startswith("Stopped before the first round"), said[0]
    wait_for(waiting.done, what="the waiting run to end")
    assert statuses(waiting)[-1] == handlers.NOT_STARTED and not has_rounds(waiting)
    assert running.status().code != Status.FINISHED  # the other visitor's run goes on

    freed_before = len(released)
    running.cancel()
    said = first.predict(api_name="/stop")
    assert said[0].startswith("Stopped:") and "freed its caches" in said[0]
    assert len(released) == freed_before + 1  # the target's caches, released by the decoder's finally
    assert not DECODE_SLOT.locked()
    assert first.predict(api_name="/stop")[0] == "Nothing to stop: the last run had already stopped."
