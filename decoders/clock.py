"""The one clock every speed figure in SpecLab is read from: the decoders, the app and bench.

What "decode time" includes, for every method (chain, tree, beam, and transformers' generate in bench):

- it starts when the prompt has been read (prefill done: the prompt's KV cache exists) and stops when the last
  token is committed;
- it counts drafting, verification and bookkeeping, and the recorder's own work (a few percent; bench measures it
  with record=False runs);
- it leaves out the prefill (reported on its own as prefill_seconds) and the time a consumer holds a yielded round
  (the app drawing it, a slow client): that time is paused;
- on CUDA, GPU work is counted where it happens, without a synchronize of the clock's own inside a round: a mark
  there is a CUDA event, and the round's one device-to-host read (`read`, decoders/readout.py), which waits for the
  device anyway, places the pending marks on the host's timeline (each as late as its event says, counted back
  from the read's own event, recorded just before the copy). Marks after the read are host readings: the round's
  work is done by then, and what is queued after it (the cache compaction) is waited for by the next round's first
  mark, so it is counted there, in that round's bookkeeping. Outside rounds (the start, the end of prefill, the end
  of the run) and where no read settles the marks (the batch loop), a reading waits for the device first.

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


class _Mark:
    """A point on the host's timeline (perf_counter seconds); on CUDA, until the next read, only a recorded event."""

    def __init__(self, seconds: float | None = None, event=None):
        self.seconds = seconds  # None while pending
        self.event = event  # torch.cuda.Event(enable_timing=True), or None for a host reading
        self.pause = 0.0  # paused seconds right after this mark: left out of the lap that begins here


class Lap:
    """The seconds between two marks, pauses left out: float(lap). On CUDA a lap inside a round is known once the
    round's read has waited for the device; read earlier (or with no read to wait for), it waits for the device."""

    def __init__(self, clock: "DecodeClock", begin: _Mark, end: _Mark):
        self.clock, self.begin, self.end = clock, begin, end

    def __float__(self) -> float:
        if self.begin.seconds is None or self.end.seconds is None:
            self.clock._settle_by_waiting()
        return self.end.seconds - self.begin.seconds - self.begin.pause


class DecodeClock:
    """Laps from one start; prefill_done() marks where decode time begins; pauses are left out."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self._start = self.last = _Mark(self._waited())
        self._prefill_end: _Mark | None = None
        self.paused_seconds = 0.0  # time spent outside the decoder (while a yielded round was being consumed)
        self._pending: list[_Mark] = []  # CUDA events not yet placed on the host's timeline
        self._settled = False  # right after a read: the device holds no work of this round, host time is its time

    def _waited(self) -> float:
        """Host time after all the device's queued work (a synchronize: only outside rounds)."""
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @property
    def start(self) -> float:
        """Host seconds (perf_counter) when the clock started."""
        return self._start.seconds

    @property
    def prefill_end(self) -> float | None:
        """Host seconds where decode time begins (None before prefill_done or the first lap)."""
        if self._prefill_end is not None and self._prefill_end.seconds is None:
            self._settle_by_waiting()
        return self._prefill_end.seconds if self._prefill_end is not None else None

    def _mark(self) -> _Mark:
        if not self.cuda or self._settled:
            return _Mark(time.perf_counter())
        mark = _Mark(event=_recorded_event())
        self._pending.append(mark)
        return mark

    def prefill_done(self) -> float:
        """Mark the end of prefill; returns the prefill's seconds."""
        mark = _Mark(self._waited_for_all())
        elapsed = mark.seconds - self.last.seconds - self.last.pause
        self._prefill_end = self.last = mark
        self.paused_seconds = 0.0  # pauses while the prompt was read (between chunks) are out of `elapsed` already
        return elapsed

    def lap(self) -> Lap:
        """The lap since the previous one (or since prefill); the first lap also marks prefill if nobody did."""
        mark = self._mark()
        lap, self.last = Lap(self, self.last, mark), mark
        if self._prefill_end is None:
            self._prefill_end = mark
        return lap

    def read(self, values: torch.Tensor) -> list:
        """The round's one device-to-host copy, values.cpu().tolist(), made through the clock: the copy waits for the
        device, so the pending marks are placed on the host's timeline here, with no synchronize of their own."""
        if not self.cuda:
            return values.cpu().tolist()
        anchor = _Mark(event=_recorded_event())  # after the round's device work, just before the copy
        host = values.cpu().tolist()  # returns when the device got past the anchor: both events are complete
        anchor.seconds = time.perf_counter()
        self._place(anchor)
        self._settled = True  # until the decoder resumes after its yield (`paused`)
        return host

    def total(self) -> float:
        """Decode time so far: since the end of prefill, pauses excluded."""
        now = self._waited_for_all() if self.cuda and not self._settled else time.perf_counter()
        return now - (self._prefill_end or self._start).seconds - self.paused_seconds

    @contextmanager
    def paused(self):
        """Wrap a `yield` with this: the consumer's time is not decode time."""
        began = time.perf_counter()
        try:
            yield
        finally:
            away = time.perf_counter() - began
            self.paused_seconds += away
            self.last.pause += away  # the next lap starts where the decoder resumed
            self._settled = False  # the decoder resumes: it may queue device work again

    def _place(self, anchor: _Mark) -> None:
        """Pending marks on the host's timeline, counted back from a complete anchor event of known host time."""
        for mark in self._pending:
            mark.seconds = anchor.seconds - mark.event.elapsed_time(anchor.event) / 1000.0
        self._pending = []

    def _waited_for_all(self) -> float:
        """Outside rounds (the end of prefill, of the run) and in the batch loop: wait for the device, then read."""
        self._settle_by_waiting()
        return self._waited()

    def _settle_by_waiting(self) -> None:
        """Where no read placed the pending marks (the batch loop, a lap read early): wait for the device once."""
        if not self._pending:
            return
        anchor = _Mark(event=_recorded_event())
        anchor.event.synchronize()
        anchor.seconds = time.perf_counter()
        self._place(anchor)


def _recorded_event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
