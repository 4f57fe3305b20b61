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
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

STALE_AFTER = 60.0  # seconds a run may sit on an update nobody asked for before the next run takes over


class Lease:
    """One run's hold on the slot, with the run's decoder (a generator, or None for a run that never waits)."""

    def __init__(self, source: Iterator | None):
        self._source = source
        self._computing = threading.Lock()  # held while the decoder computes its next item or is being closed
        self._handed_at: float | None = None  # when the last item went out; None: still computing the first
        self.revoked = False

    def items(self) -> Iterator:
        """The decoder's items, ending early once a later run has taken the slot over."""
        while True:
            with self._computing:
                if self.revoked:
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

    def _close_source(self) -> None:
        if self._source is not None and hasattr(self._source, "close"):
            self._source.close()  # suspended, not running (we hold _computing): its finally frees the caches


class DecodeSlot:
    def __init__(self, stale_after: float = STALE_AFTER):
        self.stale_after = stale_after
        self._changed = threading.Condition()
        self._lease: Lease | None = None

    def locked(self) -> bool:
        return self._lease is not None

    @contextmanager
    def hold(self, source: Iterator | None = None) -> Iterator[Lease]:
        """Wait for the slot (taking it over from a stale holder) and hold it for the block; `source`, the run's
        decoder, is iterated through `lease.items()` and closed when the block ends, however it ends."""
        lease = Lease(source)
        with self._changed:
            while self._lease is not None:
                if self._lease.idle() > self.stale_after and self._lease.revoke():
                    break
                self._changed.wait(timeout=min(1.0, self.stale_after))
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

    def _leave(self, lease: Lease) -> None:
        with self._changed:
            if self._lease is lease:  # a run taken over leaves a slot that is no longer its own
                self._lease = None
                self._changed.notify_all()


DECODE_SLOT = DecodeSlot()  # the one slot of this process: Generate, Race, Beams and Whisper all take it
