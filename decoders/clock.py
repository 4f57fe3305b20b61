"""The one clock every speed figure in SpecLab is read from: the decoders, the app and bench.

What "decode time" includes, for every method (chain, tree, beam, and transformers' generate in bench):

- it starts when the prompt has been read (prefill done: the prompt's KV cache exists) and stops when the last
  token is committed;
- it counts drafting, verification and bookkeeping, and the recorder's own work (a few percent; bench measures it
  with record=False runs);
- it leaves out the prefill (reported on its own as prefill_seconds) and the time a consumer holds a yielded round
  (the app drawing it, a slow client): that time is paused;
- on CUDA every reading synchronizes first, so GPU work is counted where it happens.

Two readings of this one clock, each used for every row of a table:
- decode tokens/s = generated tokens / decode time (the app, the Race, the traces' totals "tokens_per_second").
- steady tokens/s = tokens after the first round / (decode time − the first round's time): vLLM's convention of
  time-to-first-token plus the rate after it. transformers' generate cannot be split at the end of prefill (its
  first target forward reads the prompt together with the first drafts), so wherever SpecLab runs next to it (bench)
  both sides use this reading: ours from the trace (decoders/stats.py "steady_tokens_per_second"), transformers'
  from its streamer's first and last delivery (bench/peers.py).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class DecodeClock:
    """Wall-clock laps from one start; prefill_done() marks where decode time begins; pauses are left out."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.start = self.last = self._now()
        self.prefill_end: float | None = None
        self.paused_seconds = 0.0  # time spent outside the decoder (while a yielded round was being consumed)

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def prefill_done(self) -> float:
        """Mark the end of prefill; returns the prefill's seconds."""
        now = self._now()
        self.prefill_end = now
        elapsed, self.last = now - self.last, now
        self.paused_seconds = 0.0  # pauses while the prompt was read (between chunks) are out of `elapsed` already
        return elapsed

    def lap(self) -> float:
        """Seconds since the previous lap (or since prefill); the first lap also marks prefill if nobody did."""
        now = self._now()
        elapsed, self.last = now - self.last, now
        if self.prefill_end is None:
            self.prefill_end = now
        return elapsed

    def total(self) -> float:
        """Decode time so far: since the end of prefill, pauses excluded."""
        return self._now() - (self.prefill_end or self.start) - self.paused_seconds

    @contextmanager
    def paused(self):
        """Wrap a `yield` with this: the consumer's time is not decode time."""
        began = time.perf_counter()
        try:
            yield
        finally:
            away = time.perf_counter() - began
            self.paused_seconds += away
            self.last += away  # the next lap starts where the decoder resumed
