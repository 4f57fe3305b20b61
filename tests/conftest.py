"""Shared fixtures. Tiny random-init models come from tests/tiny.py; real weights from decoders.models."""
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
