"""Shared fixtures. Tiny random-init models come from tests/tiny.py; real weights from decoders.models."""
from __future__ import annotations

import gc
import os
import sys
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

    return {"same": tiny, "noisy": noisy_copy(tiny, noise=0.02), "unrelated": tiny_llama(seed=7, layers=2)}


@pytest.fixture(autouse=True)
def _no_run_left_holding_the_decode_lock():
    """A test that fails with a run generator still open leaves app.handlers.DECODE_LOCK held, and every later run
    in the session would wait for it forever (a 90-minute CI hang instead of one failure). Fail that test instead
    and free the lock for the rest."""
    yield
    handlers = sys.modules.get("app.handlers")
    lock = getattr(handlers, "DECODE_LOCK", None)
    if lock is not None and lock.locked() and not _app_server_running():
        # A run suspended inside the lock whose server has closed is garbage: collecting it closes the generator,
        # which leaves the lock as a live server would once the run object dies. Only a run still referenced fails.
        gc.collect()
    if lock is not None and lock.locked() and not _app_server_running():
        lock.release()
        pytest.fail("the test left a decode run open (app.handlers.DECODE_LOCK held); close the run generator")


def _app_server_running() -> bool:
    """A launched demo (tests/app_server.py) may still be finishing a run in its own thread: leave its lock alone."""
    server = sys.modules.get("app_server")
    return bool(server and getattr(server, "RUNNING", 0))
