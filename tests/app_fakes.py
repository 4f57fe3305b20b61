"""Stand-ins for the Generate tab's model loading, so a handler test runs without weights (one copy, shared)."""
from __future__ import annotations

import contextlib


class FakeTarget:
    """What handlers.run reads of a loaded target before decoding: its dtype and its prompt encoding."""

    dtype = "float32"

    def encode_prompt(self, prompt, chat=True):
        return [1, 2, 3]


@contextlib.contextmanager
def fake_loaded(*options, report=None, turn=None, stop=None):
    """app.shared.loading.loaded's shape: one (target, draft) pair per option set."""
    yield [(FakeTarget(), None)]
