"""app/shared/decode_slot.py: one decode at a time; a holder that waits on an update nobody asks for is taken over after
stale_after seconds (its decoder closed, its caches freed), a holder that computes never is."""
from __future__ import annotations

import threading
import time

from app.shared.decode_slot import DecodeSlot


def _decoder(closed: list, compute: float = 0.0):
    try:
        for i in range(1000):
            time.sleep(compute)
            yield i
    finally:
        closed.append("closed")  # the real decoder frees its caches here


def _in_thread(fn) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_an_abandoned_holder_is_taken_over_and_its_decoder_closed():
    slot, closed, got = DecodeSlot(stale_after=0.3), [], []

    def run():
        with slot.hold(_decoder(closed)) as lease:
            for item in lease.items():
                yield item
    abandoned = run()
    assert next(abandoned) == 0 and slot.locked()  # suspended inside the slot, and nobody asks for more

    def second_run():
        with slot.hold():
            got.append("took over")
    started = time.monotonic()
    _in_thread(second_run).join(5)
    assert got == ["took over"] and closed == ["closed"]
    assert 0.3 <= time.monotonic() - started < 3
    assert list(abandoned) == []  # should its consumer come back, the run just ends


def test_a_holder_that_keeps_computing_is_never_taken_over():
    slot, closed, order = DecodeSlot(stale_after=0.05), [], []

    def slow_run():
        with slot.hold(_decoder(closed, compute=0.3)) as lease:
            for item in lease.items():
                if item == 2:
                    break
        order.append("first done")
    first = _in_thread(slow_run)
    time.sleep(0.1)
    with slot.hold():  # waits the whole 0.9 s: the holder computes, it is not idle
        order.append("second")
    first.join(5)
    assert order == ["first done", "second"] and closed == ["closed"]


def test_a_waiting_run_starts_when_the_holder_leaves_and_the_slot_frees_on_errors():
    slot, closed = DecodeSlot(stale_after=60), []
    try:
        with slot.hold(_decoder(closed)) as lease:
            next(lease.items())
            raise RuntimeError("a failing run")
    except RuntimeError:
        pass
    assert not slot.locked() and closed == ["closed"]  # the decoder is closed however the block ends


def test_release_idle_frees_a_suspended_holder_at_once_but_not_one_still_computing():
    slot, closed = DecodeSlot(stale_after=60), []

    def run():
        with slot.hold(_decoder(closed)) as lease:
            yield from lease.items()
    suspended = run()
    next(suspended)
    assert slot.release_idle() and not slot.locked() and closed == ["closed"]
    with slot.hold():
        assert not slot.release_idle()  # computing (never handed an item out): left alone


def test_a_stop_racing_a_run_that_leaves_the_queue_cannot_lose_it():
    """Stop pressed while a run is queued, and the run leaves the queue while Stop is still updating the counters
    (forced here: adding to `skip` takes 50 ms). The run must not decode, and must not leave a stray skip that would
    swallow the tab's next Run; before the counters had a lock, it decoded and the next Run was skipped."""
    import threading
    import time

    from app.shared.session import RunSession

    class SlowInt(int):
        def __add__(self, other):
            time.sleep(0.05)  # Stop is between taking the queued count and recording it as skips
            return SlowInt(int(self) + other)

    session = RunSession()
    session.skip = SlowInt(0)
    session.admit()
    stopping = threading.Thread(target=session.request_stop)
    stopping.start()
    time.sleep(0.01)
    began = session.begin()  # the queued run leaves the queue now
    stopping.join()
    assert not began and session.skip == 0
    session.admit()
    assert session.begin()  # the next Run decodes


def test_close_ends_a_computing_run_at_its_next_item_and_waits_for_it():
    """Shutdown (the atexit hook): the run in a worker thread finishes the item it computes, stops there (its decoder
    closed, caches freed), and close() returns only then; a run that arrives afterwards never starts."""
    import pytest

    from app.shared.decode_slot import SlotClosed

    slot, closed, got = DecodeSlot(stale_after=60), [], []

    def run():
        with slot.hold(_decoder(closed, compute=0.3)) as lease:
            got.extend(lease.items())
    worker = _in_thread(run)
    time.sleep(0.45)  # inside its second item
    started = time.monotonic()
    assert slot.close(timeout=5)
    assert 0.05 < time.monotonic() - started < 2 and closed == ["closed"] and got == [0, 1]
    worker.join(5)
    refused = _decoder(closed)
    with pytest.raises(SlotClosed):
        with slot.hold(refused):
            pass
    assert list(refused) == [] and closed == ["closed"]  # closed without ever computing an item


def test_close_closes_a_suspended_run_at_once_and_reports_one_still_computing():
    slot, closed = DecodeSlot(stale_after=60), []

    def run():
        with slot.hold(_decoder(closed)) as lease:
            yield from lease.items()
    suspended = run()
    next(suspended)  # its consumer went away (the server closed mid-run): nobody asks for the next item
    assert slot.close(timeout=5) and closed == ["closed"]

    busy, release = DecodeSlot(stale_after=60), threading.Event()

    def load():
        with busy.hold():  # a source-less holder (a model load) computes for its whole block
            release.wait(5)
    loader = _in_thread(load)
    time.sleep(0.05)
    assert not busy.close(timeout=0.2)  # still computing after the timeout: the exit hook must not finalize
    release.set()
    loader.join(5)
    assert busy.close(timeout=1)


def test_the_exit_hook_ends_the_process_itself_when_a_run_is_still_computing():
    """Finalizing under a thread still inside PyTorch would abort (status 134); after the wait, the hook ends the
    process with status 1 instead, saying why."""
    import subprocess
    import sys

    script = ("import threading, time\n"
              "from app.shared.decode_slot import DecodeSlot, _close_at_exit\n"
              "slot = DecodeSlot()\n"
              "def load():\n"
              "    with slot.hold():\n"
              "        time.sleep(30)\n"
              "threading.Thread(target=load, daemon=True).start()\n"
              "time.sleep(0.2)\n"
              "_close_at_exit(slot, timeout=0.5)\n"
              "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "not reached" not in done.stdout
    assert "still computing" in done.stderr and "Waiting for the running decode" in done.stderr


class _SlowToClose:
    """A suspended decoder whose close takes until `release` is set (a Whisper run joining its worker)."""

    def __init__(self):
        self.release, self.closing = threading.Event(), threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        return 0

    def close(self):
        self.closing.set()
        self.release.wait(10)


def test_a_stale_run_is_closed_outside_the_slots_lock():
    """Review 14d8f23 #7: the run that takes a stale holder over closes it; while that close takes its time, every
    other caller of the slot (a leave, release_idle, a look at who holds it) must still get through. Before, the
    close ran under the slot's lock and they all waited for it."""
    slot, source = DecodeSlot(stale_after=0.2), _SlowToClose()

    def abandoned():
        with slot.hold(source) as lease:
            yield from lease.items()
    run = abandoned()
    next(run)  # suspended, and nobody asks for more: stale after 0.2 s
    def take_over():
        with slot.hold():
            pass
    taker = _in_thread(take_over)
    assert source.closing.wait(5)  # the taker is inside the stale run's close now
    looked = []
    looker = _in_thread(lambda: looked.append(slot.release_idle()))
    looker.join(2)
    try:
        assert looked, "the slot's lock was held while a stale run closed"
    finally:
        source.release.set()
        taker.join(5)


def test_waiting_runs_go_in_order_and_say_what_holds_the_slot():
    slot, order, lines = DecodeSlot(stale_after=60), [], []
    holding, done = threading.Event(), threading.Event()

    def holder():
        with slot.hold(what="a Race"):
            holding.set()
            done.wait(10)
    _in_thread(holder)
    assert holding.wait(5)

    def waiter(name: str):
        with slot.queue(f"run {name}") as turn:
            for line in turn.lines(every=0.05):
                lines.append((name, line))
            with slot.hold(what=f"run {name}", turn=turn):
                order.append(name)
    first = _in_thread(lambda: waiter("A"))
    while not any(name == "A" for name, _ in lines):
        time.sleep(0.01)
    second = _in_thread(lambda: waiter("B"))
    while not any(name == "B" for name, _ in lines):
        time.sleep(0.01)
    done.set()
    first.join(5), second.join(5)
    assert order == ["A", "B"]
    said = dict(lines)
    assert "a Race has been running for" in said["A"] and "1 other run is waiting ahead of yours" in said["B"]
    assert slot.holder() is None


def test_stop_while_waiting_gives_the_place_up():
    slot, release = DecodeSlot(stale_after=60), threading.Event()
    def load():
        with slot.hold(what="a load"):
            release.wait(5)
    _in_thread(load)
    while slot.holder() is None:
        time.sleep(0.01)
    stop = threading.Event()
    with slot.queue("a Generate run") as turn:
        seen = []
        for line in turn.lines(stop=stop.is_set, every=0.05):
            seen.append(line)
            stop.set()
        assert turn.cancelled and len(seen) == 1
    assert slot._line == []  # nobody waits behind a run that gave up
    release.set()


def test_a_place_nobody_looks_at_loses_its_turn():
    """A waiting run whose page went away without closing it stops looking; after stale_after it is skipped."""
    slot = DecodeSlot(stale_after=0.3)
    gone = slot.queue("a run whose page went away")
    gone.__enter__()  # in line, and never looks again
    started = time.monotonic()
    with slot.hold(what="the next run"):
        assert time.monotonic() - started < 3


def test_a_busy_source_counts_as_computing_and_keeps_the_slot_until_its_thread_ends():
    """A Whisper transcription whose worker still decodes while the run is suspended is computing: not taken over,
    and the slot stays held after its block ends until the thread does (one computation at a time)."""
    slot, running = DecodeSlot(stale_after=0.1), threading.Event()
    running.set()

    class Busy:
        def __iter__(self):
            return self

        def __next__(self):
            return 0

        def busy(self):
            return running.is_set()

    with slot.hold(Busy()) as lease:
        next(lease.items())
        time.sleep(0.2)
        assert lease.idle() == 0 and lease.computing()
        assert not slot.release_idle()
    assert slot.locked()  # the block ended, its thread did not
    assert not slot.close(timeout=0.2)
    running.clear()
    assert not slot.locked() and slot.close(timeout=1)


class _FakeTime:
    """The slot's clock, moved by hand: a minute passes without a minute of test."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_slow_waiter_that_looks_again_gets_its_turn(monkeypatch):
    """A waiting run whose page did not look for longer than stale_after (a background tab, a busy server) drops
    out of the line while another run passes it; when it looks again it is alive: it goes back in line and takes
    the slot once free, never saying "waiting" for ever with the slot free."""
    from app.shared import decode_slot
    clock = _FakeTime()
    monkeypatch.setattr(decode_slot, "time", clock)
    slot, release, holding = DecodeSlot(stale_after=60), threading.Event(), threading.Event()

    def holder():
        with slot.hold(what="a Race"):
            holding.set()
            release.wait(10)
    held = _in_thread(holder)
    assert holding.wait(5)
    with slot.queue("the slow run") as slow:
        slow_lines = slow.lines(every=0)
        assert "a Race has been running" in next(slow_lines)
        clock.now += 61  # the slow run's page does not look for a minute
        with slot.queue("the next run") as passing:
            assert "waiting ahead" not in next(passing.lines(every=0))  # the slow run dropped out of its way
            release.set()
            held.join(5)
            assert list(passing.lines(every=0)) == []
            with slot.hold(turn=passing):
                pass
        looked_again = [line for _, line in zip(range(3), slow_lines)]
        assert looked_again == [], f"the slot is free, yet the slow run still waits: {looked_again}"
        with slot.hold(turn=slow):
            assert slot.holder()[0] == "the slow run"
    assert slot.holder() is None and slot._line == []


def test_a_place_that_looks_again_goes_back_to_where_it_stood(monkeypatch):
    from app.shared import decode_slot
    clock = _FakeTime()
    monkeypatch.setattr(decode_slot, "time", clock)
    slot, release, holding = DecodeSlot(stale_after=60), threading.Event(), threading.Event()

    def holder():
        with slot.hold(what="a load"):
            holding.set()
            release.wait(10)
    held = _in_thread(holder)
    assert holding.wait(5)
    try:
        with slot.queue("first") as first, slot.queue("second") as second:
            next(first.lines(every=0))
            clock.now += 61
            assert "waiting ahead" not in next(second.lines(every=0))  # first dropped out: second leads
            assert "waiting ahead" not in next(first.lines(every=0))  # first looked again: back at the front
            assert "1 other run is waiting ahead of yours" in next(second.lines(every=0))
            assert [p.what for p in slot._line] == ["first", "second"]
    finally:
        release.set()
        held.join(5)
