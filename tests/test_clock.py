"""The decode clock on CUDA without a GPU: torch.cuda.synchronize and torch.cuda.Event replaced by counting fakes.

A round must not wait for the device on its own (issue 46): its laps are CUDA events, placed on the host's timeline
by the round's one read (decoders/readout.py), which waits anyway. The seconds must still tile decode time: every
round's draft + verify + bookkeeping runs from where the previous round's ended, so the sum over rounds 1..k lies
between the decode time reported after round k - 1 and after round k (decoders/clock.py says what it includes).
"""
from __future__ import annotations

import time

import pytest
import torch

from decoders import DecodeOptions, loop, stream
from decoders.clock import DecodeClock


class FakeCuda:
    """Counts every wait for the device: torch.cuda.synchronize() and Event.synchronize(). Events stamp the host time
    they are recorded at plus a lag per event, like a device that runs behind the host."""

    def __init__(self, lag: float = 0.0):
        self.waits, self.lag, self.recorded = 0, lag, 0
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                assert enable_timing, "elapsed_time needs enable_timing=True"
                self.at = None

            def record(self, stream=None):
                fake.recorded += 1
                self.at = time.perf_counter() + fake.lag

            def elapsed_time(self, end) -> float:  # milliseconds, like CUDA's
                assert self.at is not None and end.at is not None, "an event read before it was recorded"
                return (end.at - self.at) * 1000.0

            def synchronize(self):
                fake.waits += 1

            def query(self) -> bool:
                return True

        self.Event = Event

    def synchronize(self, device=None):
        self.waits += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(loop, "DecodeClock", lambda device: DecodeClock("cuda"))  # the CPU run, timed as on CUDA
    return fake


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_cuda_round_waits_for_the_device_only_in_its_read(tiny, drafts, fake_cuda, temperature):
    options = DecodeOptions(method="speculative", rule="static", gamma=3, max_new_tokens=20, temperature=temperature)
    waits, recorded, decode = [], [], []
    live = stream(options, [1, 2, 3], target=tiny, draft=drafts["noisy"])
    for trace in live:
        waits.append(fake_cuda.waits)
        recorded.append(fake_cuda.recorded)
        decode.append(trace.decode_seconds)
    per_round = [b - a for a, b in zip(waits, waits[1:])]  # rounds 2..n: the first also holds the prefill
    assert len(per_round) >= 3 and per_round == [0] * len(per_round), per_round
    assert all(b - a >= 3 for a, b in zip(recorded, recorded[1:]))  # two laps and the read's anchor, as events
    rounds = trace.rounds
    assert all(s >= 0 for r in rounds for s in r.seconds.values())
    tiled = [sum(sum(r.seconds.values()) for r in rounds[:k + 1]) for k in range(len(rounds))]
    assert tiled[0] <= decode[0]
    for k in range(1, len(rounds)):
        assert decode[k - 1] <= tiled[k] <= decode[k], (k, decode[k - 1], tiled[k], decode[k])
    assert tiled[-1] <= trace.decode_seconds


def test_a_lap_is_as_late_as_its_event_says():
    """The device still has 50 ms of work queued when the draft lap is marked: the lap ends when the device got
    there (its event), not when the host asked; the read, which waited for it, places it without a wait of its own."""
    fake = FakeCuda()
    saved = torch.cuda.synchronize, torch.cuda.Event
    torch.cuda.synchronize, torch.cuda.Event = fake.synchronize, fake.Event
    try:
        clock = DecodeClock("cuda")
        clock.prefill_done()
        asked = time.perf_counter()
        fake.lag = 0.05  # the event completes 50 ms after it is recorded
        draft = clock.lap()
        fake.lag = 0.0
        time.sleep(0.06)  # the host goes on; the read below is after the device's queued work
        waits = fake.waits
        clock.read(torch.zeros(3))
        assert fake.waits == waits  # placing the marks waited for nothing
        verify = clock.lap()  # after the read: a host reading
        assert float(draft) >= 0.05 > asked - clock.prefill_end
        assert float(draft) + float(verify) <= clock.total()
    finally:
        torch.cuda.synchronize, torch.cuda.Event = saved


def test_the_cpu_clock_needs_no_cuda(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the CPU clock touched CUDA")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    monkeypatch.setattr(torch.cuda, "Event", refuse)
    clock = DecodeClock("cpu")
    clock.prefill_done()
    lap = clock.lap()
    assert clock.read(torch.arange(2)) == [0, 1] and float(lap) >= 0 and clock.total() >= float(lap)
    assert clock.prefill_end - clock.start >= 0  # seconds, as the beams' runner reads them
