"""Shared fixtures. Tiny random-init models come from tests/tiny.py; real weights from decoders.runtime.models."""
from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # `from tiny import ...`
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a model hub
# One thread: tiny models gain nothing from two, and on a shared 2-core machine two processes with two OpenMP
# threads each can slow each other down a hundredfold. Real-weight tests raise it (tests/test_real_models.py).
torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs real weights (minutes on a 2-core CPU); still run by make test")
    config.addinivalue_line("markers", "space: builds and starts the app as a Hugging Face Space (tests/space_env.py); "
                                       "run by make test")



@pytest.fixture(scope="session")
def tiny():
    from tiny import tiny_llama

    return tiny_llama(layers=4)


@pytest.fixture(scope="session")
def drafts(tiny):
    """The three draft kinds the equality tests cover: the target itself, a noisy copy, an unrelated model."""
    from tiny import noisy_copy, tiny_llama

    # The noisy copy starts from a fresh twin of `tiny` (same seed, same weights): a bench test may have packed the
    # session's `tiny` for oneDNN (bench/runner.py), and packed weights cannot be deep-copied.
    return {"same": tiny, "noisy": noisy_copy(tiny_llama(layers=4), noise=0.02), "unrelated": tiny_llama(seed=7, layers=2)}


@pytest.fixture
def private_residency():
    """A model residency of the test's own (decoders/runtime/residency.py), for tests that call models.unload_all() directly
    or through bench's free_models: they clear this one instead of evicting the real models the other tests share
    (each eviction cost the next real-weight test a reload). The memory budget a test sets is undone too."""
    from decoders.runtime import models, residency

    private = residency.Residency()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "_RESIDENT", private)
        patch.setattr(models, "_TOKENIZERS", {})
        patch.setattr(models, "_COMPATIBLE", {})
        patch.setattr(residency, "_BUDGET_GB", residency._BUDGET_GB)  # restored after set_memory_budget in the test
        yield private
    private.clear()
    residency.release_memory()  # the test's own models go now, not at some later collection


# ---- one demo server and one Chromium for all browser modules ----------------------------------------------------
# Each browser module used to launch its own demo and Chromium (~6 s of setup each on CI). These are started lazily by
# the first test that asks for them and closed as soon as the next test does not (pytest_runtest_teardown below), so
# the tests after the browser modules run with no server up, as before (the decode-lock check below needs that).
SHARED_FIXTURES = ("demo_url", "browser")
SHARED = pytest.StashKey[list]()  # the shared objects set up in this session, on config.stash (closed in that order)


@pytest.fixture(scope="session")
def shared_demo(request):
    from app_server import SharedDemo

    demo = SharedDemo()
    request.config.stash.setdefault(SHARED, []).append(demo)
    yield demo
    demo.close()


@pytest.fixture(scope="session")
def shared_chromium(request):
    from chromium import SharedChromium

    chromium = SharedChromium()
    request.config.stash.setdefault(SHARED, []).insert(0, chromium)  # the browser closes before the server
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def demo_url(shared_demo) -> str:
    """The shared demo's local URL (tests/app_server.py)."""
    return shared_demo.url()


@pytest.fixture(scope="module")
def browser(shared_chromium):
    """The shared headless Chromium (tests/chromium.py); open a fresh context or page on it per module or test."""
    return shared_chromium.browser()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the module fixtures are torn down: close the shared demo and Chromium when the next test needs neither."""
    yield
    if nextitem is not None and any(name in nextitem.fixturenames for name in SHARED_FIXTURES):
        return
    for shared in item.config.stash.get(SHARED, []):
        if shared.started:
            shared.close()


@pytest.fixture(autouse=True)
def _no_run_left_holding_the_decode_lock():
    """A run generator left suspended inside the decode slot (app/shared/decode_slot.py; a failed test, or a browser test's server
    closed mid-run) would make the next run wait STALE_AFTER seconds before taking the slot over. Take it back at
    once instead; a holder still computing with no server left to drive it is a test bug: fail that test."""
    yield
    slot_module = sys.modules.get("app.shared.decode_slot")
    slot = getattr(slot_module, "DECODE_SLOT", None)
    if slot is None or not slot.locked() or _app_server_running():
        return
    gc.collect()  # a run nobody references any more closes itself when collected
    deadline = time.monotonic() + 30  # a round still computing in a closed server's worker thread ends soon
    while not slot.release_idle():
        if time.monotonic() > deadline:
            pytest.fail("the test left a decode run computing in the background (app.shared.decode_slot.DECODE_SLOT held)")
        time.sleep(0.2)


def _app_server_running() -> bool:
    """A launched demo (tests/app_server.py) may still be finishing a run in its own thread: leave its lock alone."""
    server = sys.modules.get("app_server")
    return bool(server and getattr(server, "RUNNING", 0))
