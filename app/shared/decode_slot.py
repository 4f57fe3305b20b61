"""One decode at a time, process-wide, and no abandoned run can keep the turn forever.

Why one at a time: the layer-skip drafter swaps decoder layers out of the shared, cached target model while it
drafts, so a second run on that model at the same moment would see a half-skipped model; timings of concurrent runs
would also be meaningless on a 2-core CPU. The Run, Race and Beams events share one Gradio concurrency group of
size 1 (the tabs' click events) and this slot guards any other caller.

Why not a plain lock: a streaming run holds the slot while it waits, between two rounds, for its consumer to ask
for the next update. A consumer that goes away without closing the run (a dropped connection, a server shut down
mid-run, an abandoned API iterator) would leave a plain lock held and hang every later run. Here a holder that has
handed out an update and not been asked for the next one for `stale_after` seconds is taken over by the next run:
its decoder is closed (its `finally` frees the caches) and, should its consumer ever come back, the run just ends.
A holder that is computing is never taken over, however long it takes.

Why the slot also ends the process's runs at exit: Gradio runs each decode in a daemon worker thread, and when the
server stops (Ctrl-C, or a script that closes its demo and ends) CPython 3.11 finalizes while that thread may still
be inside a PyTorch op. When the op returns it tries to take the GIL, CPython ends the thread with pthread_exit, and
the forced unwind through PyTorch's C++ frames calls std::terminate: "terminate called without an active exception",
SIGABRT, exit status 134 (gdb: take_gil -> PyThread_exit_thread -> _Unwind_ForcedUnwind -> std::terminate, from
THPVariable_* in libtorch_python). Every model computation of the app runs inside this slot, so `close()` -- called
by an atexit hook, which CPython runs before it finalizes -- refuses new holders, ends a streaming holder at its next
item (closing a suspended one at once, which stops and joins a Whisper worker) and waits until no thread computes.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

STALE_AFTER = 60.0  # seconds a run may sit on an update nobody asked for before the next run takes over
EXIT_WAIT = 120.0  # seconds the process waits at exit for a computing run to reach its next item


class SlotClosed(RuntimeError):
    """The process is shutting down: no new decode starts (the tabs show it as an error line)."""


class Lease:
    """One run's hold on the slot, with the run's decoder (a generator, or None for a run that never waits)."""

    def __init__(self, source: Iterator | None, closing: threading.Event | None = None):
        self._source = source
        self._computing = threading.Lock()  # held while the decoder computes its next item or is being closed
        self._handed_at: float | None = None  # when the last item went out; None: still computing the first
        self._closing = closing or threading.Event()  # the slot's: set once the process is shutting down
        self.revoked = False

    @property
    def ending(self) -> bool:
        """Whether this run should stop at its next step: taken over, or the process is shutting down."""
        return self.revoked or self._closing.is_set()

    def items(self) -> Iterator:
        """The decoder's items, ending early once a later run has taken the slot over or the process shuts down."""
        while True:
            with self._computing:
                if self.ending:
                    return
                try:
                    item = next(self._source)
                except StopIteration:
                    return
                self._handed_at = time.monotonic()
            yield item

    def idle(self) -> float:
        """Seconds since the last item went out; 0 while computing and before the first item."""
        if self._handed_at is None or self._computing.locked():
            return 0.0
        return time.monotonic() - self._handed_at

    def revoke(self) -> bool:
        """End an idle holder's run from another thread; False when it is computing right now."""
        if not self._computing.acquire(blocking=False):
            return False
        try:
            self.revoked = True
            self._close_source()
        finally:
            self._computing.release()
        return True

    def close(self) -> None:
        with self._computing:
            self._close_source()

    def computing(self) -> bool:
        """Whether a thread may be inside the run's computation now: a source-less holder counts as computing for
        its whole hold (it computes in its own block), a streaming one only between asking for an item and getting it."""
        return self._source is None or self._computing.locked()

    def _close_source(self) -> None:
        if self._source is not None and hasattr(self._source, "close"):
            self._source.close()  # suspended, not running (we hold _computing): its finally frees the caches


class DecodeSlot:
    def __init__(self, stale_after: float = STALE_AFTER):
        self.stale_after = stale_after
        self._changed = threading.Condition()
        self._lease: Lease | None = None
        self._closing = threading.Event()

    def locked(self) -> bool:
        return self._lease is not None

    @property
    def closing(self) -> bool:
        """Whether the process is shutting down (close() was called): a run between two steps stops there."""
        return self._closing.is_set()

    @contextmanager
    def hold(self, source: Iterator | None = None) -> Iterator[Lease]:
        """Wait for the slot (taking it over from a stale holder) and hold it for the block; `source`, the run's
        decoder, is iterated through `lease.items()` and closed when the block ends, however it ends."""
        lease = Lease(source, self._closing)
        with self._changed:
            while self._lease is not None and not self._closing.is_set():
                if self._lease.idle() > self.stale_after and self._lease.revoke():
                    break
                self._changed.wait(timeout=min(1.0, self.stale_after))
            if self._closing.is_set():
                if hasattr(source, "close"):
                    source.close()  # never started: closing it runs no computation
                raise SlotClosed("the server is shutting down; no new run starts")
            self._lease = lease
        try:
            yield lease
        finally:
            lease.close()
            self._leave(lease)

    def release_idle(self) -> bool:
        """Take the slot back now from a holder that is not computing (tests: a server closed mid-run). True if
        the slot is free afterwards."""
        with self._changed:
            lease = self._lease
            if lease is not None and lease.idle() > 0 and lease.revoke():
                self._lease = None
                self._changed.notify_all()
            return self._lease is None

    def close(self, timeout: float | None = None) -> bool:
        """Shut the slot for good: no new holder; the holder ends at its next item, or at once if it is suspended
        (its decoder closed here, which for a Whisper run stops and joins its worker thread); then wait until no
        thread computes. True when none does; False when one still computed after `timeout` seconds."""
        self._closing.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            self._changed.notify_all()  # runs waiting for their turn give up (SlotClosed)
            while True:
                lease = self._lease
                if lease is None or (lease._source is not None and lease.revoke()):
                    return True  # free, or suspended and now closed: no thread is inside its computation
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return not lease.computing()
                self._changed.wait(timeout=0.2 if left is None else min(0.2, left))

    def _leave(self, lease: Lease) -> None:
        with self._changed:
            if self._lease is lease:  # a run taken over leaves a slot that is no longer its own
                self._lease = None
                self._changed.notify_all()


DECODE_SLOT = DecodeSlot()  # the one slot of this process: Generate, Race, Beams and Whisper all take it


def _close_at_exit(slot: DecodeSlot = DECODE_SLOT, timeout: float = EXIT_WAIT) -> None:
    """atexit: CPython runs it after the main thread ends and before it finalizes, while a worker thread may still be
    inside PyTorch (see the module comment). Wait for it; if it is still computing after `timeout` (or a second
    Ctrl-C comes), end the process now with a non-zero status instead of letting finalization abort it."""
    if slot._lease is not None:
        print("Waiting for the running decode to reach its next step (Ctrl-C again to quit at once) ...",
              file=sys.stderr, flush=True)
    try:
        if slot.close(timeout):
            return
        reason, status = f"a decode was still computing {timeout:.0f} s after exit was asked for", 1
    except KeyboardInterrupt:
        reason, status = "interrupted again while a decode was computing", 130
    print(f"{reason}: ending without interpreter shutdown (it would abort, status 134)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)


atexit.register(_close_at_exit)
