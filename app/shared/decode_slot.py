"""One decode at a time, process-wide, in the order runs asked, and no abandoned run can keep the turn forever.

Why one at a time: the layer-skip drafter swaps decoder layers out of the shared, cached target model while it
drafts, so a second run on that model at the same moment would see a half-skipped model; timings of concurrent runs
would also be meaningless on a 2-core CPU. Every run of every tab takes this slot (a model load, the Learn tab's
sampling too).

Why runs wait here and not in Gradio's queue: a run queued by Gradio cannot say anything, so a visitor whose run
waited minutes behind another visitor's saw a stale status line. The tabs' events admit a few runs at once
(QUEUE_LIMIT) and each waits in this slot's line (first come, first served) with a Turn, whose lines say what holds
the slot and for how long; Stop gives the place up.

Why not a plain lock: a streaming run holds the slot while it waits, between two rounds, for its consumer to ask
for the next update. A consumer that goes away without closing the run (a dropped connection, a server shut down
mid-run, an abandoned API iterator) would leave a plain lock held and hang every later run. Here a holder that has
handed out an update and not been asked for the next one for `stale_after` seconds is taken over by the next run:
its decoder is closed (its `finally` frees the caches) and, should its consumer ever come back, the run just ends.
A holder that is computing is never taken over, however long it takes; a thread of its own that still computes
while the run is suspended (a Whisper decode's worker) counts as computing. The stale decoder is closed outside the
slot's lock: closing can take seconds (a Whisper worker is joined), and every other hold, leave and exit needs that
lock.

Why the slot also ends the process's runs at exit: Gradio runs each decode in a daemon worker thread, and when the
server stops (Ctrl-C, or a script that closes its demo and ends) CPython 3.11 finalizes while that thread may still
be inside a PyTorch op. When the op returns it tries to take the GIL, CPython ends the thread with pthread_exit, and
the forced unwind through PyTorch's C++ frames calls std::terminate: "terminate called without an active exception",
SIGABRT, exit status 134 (gdb: take_gil -> PyThread_exit_thread -> _Unwind_ForcedUnwind -> std::terminate, from
THPVariable_* in libtorch_python). Every model computation of the app runs inside this slot, so `close()` -- called
by an atexit hook, which CPython runs before it finalizes -- refuses new holders, ends a streaming holder at its next
item (closing a suspended one at once, which stops a Whisper worker and waits a bounded time for it) and waits until
no thread computes.
"""
from __future__ import annotations

import atexit
import bisect
import itertools
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from app.shared.words import counted

STALE_AFTER = 60.0  # seconds a run may sit on an update nobody asked for before the next run takes over
EXIT_WAIT = 120.0  # seconds the process waits at exit for a computing run to reach its next item
POLL = 1.0  # seconds between two lines of a run waiting for its turn, and between two looks of a waiting hold
QUEUE_LIMIT = 8  # runs each tab's event lets into this slot's line at once (the rest wait in Gradio's queue)


class SlotClosed(RuntimeError):
    """The process is shutting down: no new decode starts (the tabs show it as an error line)."""


class Lease:
    """One run's hold on the slot, with the run's decoder (a generator, or None for a run that never waits) and what
    the run is, for the lines of the runs waiting behind it."""

    def __init__(self, source: Iterator | None, closing: threading.Event | None = None, what: str = "a run"):
        self._source = source
        self._computing = threading.Lock()  # held while the decoder computes its next item or is being closed
        self._handed_at: float | None = None  # when the last item went out; None: still computing the first
        self._closing = closing or threading.Event()  # the slot's: set once the process is shutting down
        self.what = what
        self.since = time.monotonic()  # when it took the slot (set again by hold)
        self.revoked = False
        self.left = False  # its block has ended (a thread of its source may still be finishing: `computing`)

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
        if self._handed_at is None or self.computing():
            return 0.0
        return time.monotonic() - self._handed_at

    def computing(self) -> bool:
        """Whether a thread may be inside the run's computation now: a source-less holder counts as computing for
        its whole hold (it computes in its own block), a streaming one between asking for an item and getting it,
        and while a thread of its source's own still runs (a Whisper decode's worker: the source's `busy()`)."""
        if self._source is None:
            return not self.left
        return self._computing.locked() or self._source_busy()

    def take_over(self, busy_too: bool = False) -> bool:
        """Mark a suspended run as ended, from another thread, without closing it yet: the caller may hold the
        slot's lock, and closing can take seconds (a Whisper run joins its worker). False when it computes (and,
        unless `busy_too`, while its source's own thread runs). After True, call `close_taken()` outside that lock."""
        if not self._computing.acquire(blocking=False):
            return False
        if self._source_busy() and not busy_too:
            self._computing.release()
            return False
        self.revoked = True
        return True

    def close_taken(self) -> None:
        """Close the decoder of a run taken over (its `finally` frees the caches); its consumer then sees it ended."""
        try:
            self._close_source()
        finally:
            self._computing.release()

    def close(self) -> None:
        with self._computing:
            self._close_source()

    def _source_busy(self) -> bool:
        busy = getattr(self._source, "busy", None)
        return bool(busy()) if callable(busy) else False

    def _close_source(self) -> None:
        if self._source is not None and hasattr(self._source, "close"):
            self._source.close()  # suspended, not running (we hold _computing): its finally frees the caches


_JOINED = itertools.count()  # the order in which places first joined a line (a place that looks again goes back there)


@dataclass(eq=False)
class Place:
    """A run's place in line for the slot. `polled`: when its run last looked; a place nobody looked at for
    stale_after seconds belongs to a run whose consumer went away, and loses its place -- until its run looks
    again: a consumer that was only slow (a page in a background tab, a busy server) is alive after all, and its run
    goes back to where it stood, never waiting on a line it is no longer in. `order`: when it first joined."""

    what: str
    polled: float = field(default_factory=lambda: time.monotonic())
    order: int = field(default_factory=lambda: next(_JOINED))


class Turn:
    """A run's place in line, taken before it waits so that it can say, while it waits, what it waits for.

        with DECODE_SLOT.queue("a Generate run") as turn:
            for line in turn.lines(stop=session.stop_requested.is_set):
                yield {"status": line}
            if not turn.cancelled:
                with DECODE_SLOT.hold(source, turn=turn) as lease: ...

    Leaving the block gives the place up (a run that stopped waiting, or finished)."""

    def __init__(self, slot: "DecodeSlot", what: str):
        self.slot, self.place, self.cancelled = slot, Place(what), False

    def __enter__(self) -> "Turn":
        self.slot._join(self.place)
        return self

    def __exit__(self, *exc) -> None:
        self.slot._give_up(self.place)

    def lines(self, stop: Callable[[], bool] | None = None, every: float = POLL) -> Iterator[str]:
        """One line per `every` seconds saying what this run waits for, until it may take the slot (nobody ahead and
        the slot free or stale) or `stop()` says to give up waiting (then `cancelled` is True)."""
        while (line := self.slot._waiting_line(self.place)) is not None:
            if stop is not None and stop():
                self.cancelled = True
                return
            yield line
            self.slot._wait(every)


class DecodeSlot:
    def __init__(self, stale_after: float = STALE_AFTER):
        self.stale_after = stale_after
        self._changed = threading.Condition()
        self._lease: Lease | None = None
        self._line: list[Place] = []  # runs waiting for the slot, first come first served
        self._closing = threading.Event()

    def locked(self) -> bool:
        with self._changed:
            return not self._vacant()

    @property
    def closing(self) -> bool:
        """Whether the process is shutting down (close() was called): a run between two steps stops there."""
        return self._closing.is_set()

    def holder(self) -> tuple[str, float] | None:
        """(what holds the slot, for how many seconds), or None when it is free."""
        with self._changed:
            if self._vacant():
                return None
            return self._lease.what, time.monotonic() - self._lease.since

    def queue(self, what: str) -> Turn:
        """A place in line for a run that will say what it waits for (Turn); `what` names it to those behind it."""
        return Turn(self, what)

    @contextmanager
    def hold(self, source: Iterator | None = None, what: str | None = None, turn: Turn | None = None
             ) -> Iterator[Lease]:
        """Wait for the slot, in line (after `turn`'s place when given: a run that has waited in line, saying so),
        taking it over from a stale holder, and hold it for the block; `source`, the run's decoder, is iterated
        through `lease.items()` and closed when the block ends, however it ends. `what` names the run to those
        waiting behind it (default: the turn's name)."""
        lease = Lease(source, self._closing, what or (turn.place.what if turn is not None else "a run"))
        place = turn.place if turn is not None else Place(what)
        with self._changed:
            self._join(place)
            try:
                taken = self._wait_for(place)
            finally:
                self._give_up(place)
            closing = self._closing.is_set()
            if not closing:
                self._lease, lease.since = lease, time.monotonic()
        # Outside the slot's lock: closing a decoder can take seconds, and every other hold, leave and exit waits
        # for that lock.
        if closing:
            if hasattr(source, "close"):
                source.close()  # never started: closing it runs no computation
            raise SlotClosed("the server is shutting down; no new run starts")
        try:
            if taken is not None:
                taken.close_taken()  # the stale run's finally frees its caches before this run computes
            yield lease
        finally:
            lease.close()
            self._leave(lease)

    def release_idle(self) -> bool:
        """Take the slot back now from a holder that is not computing (tests: a server closed mid-run). True if
        the slot is free afterwards."""
        with self._changed:
            lease = None if self._vacant() else self._lease
            if lease is not None and lease.idle() > 0 and lease.take_over():
                self._lease = None
                self._changed.notify_all()
            else:
                lease = None
            free = self._vacant()
        if lease is not None:
            lease.close_taken()
        return free

    def close(self, timeout: float | None = None) -> bool:
        """Shut the slot for good: no new holder; the holder ends at its next item, or at once if it is suspended
        (its decoder closed here, which for a Whisper run stops its worker and waits a bounded time for it); then
        wait until no thread computes. True when none does; False when one still computed after `timeout` seconds."""
        self._closing.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._changed:
                self._changed.notify_all()  # runs waiting for their turn give up (SlotClosed)
                lease = None if self._vacant() else self._lease
                if lease is None or (lease.revoked and not lease.computing()):
                    return True  # free, or suspended and closed: no thread is inside its computation
                taken = lease._source is not None and not lease.revoked and lease.take_over(busy_too=True)
                if not taken:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return not lease.computing()
                    self._changed.wait(timeout=0.2 if left is None else min(0.2, left))
                    continue
            lease.close_taken()  # outside the lock (a Whisper worker's bounded join); then look again

    # ---- under self._changed --------------------------------------------------------------------------------------

    def _vacant(self) -> bool:
        """Whether no run holds the slot. A run whose block ended while a thread of its source still ran keeps the
        slot until that thread ends (one computation at a time, even after a bounded join gave up waiting)."""
        lease = self._lease
        if lease is not None and lease.left and not lease.computing():
            self._lease = lease = None
        return lease is None

    def _first(self, place: Place) -> bool:
        """Whether `place` is first in line; places whose runs stopped looking for stale_after seconds drop out.
        `place`'s run is looking now, so it is alive: if it had dropped out, it goes back in at its first place
        (else it would wait behind nobody, for ever, with the slot free)."""
        now = time.monotonic()
        self._line = [p for p in self._line if p is place or now - p.polled <= self.stale_after]
        if place not in self._line:
            bisect.insort(self._line, place, key=lambda p: p.order)
        return self._line[0] is place

    def _may_take(self, place: Place) -> bool:
        """`place`'s turn: first in line, and the slot free or its holder stale (idle for stale_after seconds)."""
        place.polled = time.monotonic()
        return self._first(place) and (self._vacant() or self._lease.idle() > self.stale_after)

    def _wait_for(self, place: Place) -> Lease | None:
        """Block until `place` may take the slot (or the process shuts down); the stale holder it takes over from,
        marked as ended, if any (the caller closes it outside the lock)."""
        while not self._closing.is_set():
            if self._may_take(place):
                if self._vacant():
                    return None
                stale = self._lease
                if stale.take_over():
                    return stale
            self._changed.wait(timeout=min(POLL, self.stale_after))
        return None

    # ---- the line ---------------------------------------------------------------------------------------------------

    def _join(self, place: Place) -> None:
        with self._changed:
            place.polled = time.monotonic()
            if place not in self._line:
                bisect.insort(self._line, place, key=lambda p: p.order)

    def _give_up(self, place: Place) -> None:
        with self._changed:
            if place in self._line:
                self._line.remove(place)
                self._changed.notify_all()

    def _wait(self, seconds: float) -> None:
        with self._changed:
            self._changed.wait(timeout=seconds)

    def _waiting_line(self, place: Place) -> str | None:
        """None when `place` may take the slot now (or the process shuts down: its hold then says so); else a line
        saying what it waits for and for how long."""
        with self._changed:
            if self._closing.is_set() or self._may_take(place):
                return None
            ahead = self._line.index(place) if place in self._line else len(self._line)
            return waiting_line(None if self._vacant() else (self._lease.what, time.monotonic() - self._lease.since),
                                ahead)

    def _leave(self, lease: Lease) -> None:
        with self._changed:
            lease.left = True
            if self._lease is lease:  # a run taken over leaves a slot that is no longer its own
                self._vacant()  # frees it, unless a thread of its source still computes
            self._changed.notify_all()


def waiting_line(holder: tuple[str, float] | None, ahead: int) -> str:
    """'Waiting for your turn: a Race has been running for 42 s (one run at a time on this server); 1 run ahead of
    yours.' `ahead`: runs in line before this one."""
    parts = []
    if holder is not None:
        what, seconds = holder
        parts.append(f"{what} has been running for {seconds:.0f} s (one run at a time on this server)")
    if ahead:
        parts.append(f"{counted(ahead, 'other run')} {'is' if ahead == 1 else 'are'} waiting ahead of yours")
    return "Waiting for your turn: " + ("; ".join(parts) or "the slot is being handed over") + \
        ". Yours starts as soon as it is free; Stop gives up your place."


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
