"""Stop through the real queue (gradio_client, two visitors): a queued run is cancelled and said so, a running one
is closed and its caches freed. Tiny random-init models, slowed down so one run outlasts the other's request."""
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
    from decoders.runner import CachedModel

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


def test_stop_cancels_a_queued_run_and_a_running_one(server, released):
    from gradio_client import Client
    from gradio_client.utils import Status

    first, second = Client(server, verbose=False), Client(server, verbose=False)
    running = first.submit(*controls(), api_name="/run")
    wait_for(lambda: has_rounds(running), what="the first visitor's run to stream rounds")
    queued = second.submit(*controls(), api_name="/run")
    wait_for(lambda: queued.status().code == Status.IN_QUEUE, what="the second run to wait in the queue")

    queued.cancel()  # what the page's Stop does for its own run (cancels=[run]) ...
    said = second.predict(api_name="/stop")  # ... alongside the Stop handler
    assert said[0] == "Cancelled your queued run; nothing had started."
    assert running.status().code != Status.FINISHED  # the other visitor's run goes on

    freed_before = len(released)
    running.cancel()
    said = first.predict(api_name="/stop")
    assert said[0].startswith("Stopped:") and "freed its caches" in said[0]
    assert len(released) == freed_before + 1  # the target's caches, released by the decoder's finally
    assert not DECODE_SLOT.locked()
    assert first.predict(api_name="/stop")[0] == "Nothing to stop: the last run had already stopped."
