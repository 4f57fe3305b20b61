"""Several decoders on one clip as a stream a page can show, stop and abandon: `transcribe_each`.

Why a worker thread: whisper's DecodingTask runs its whole search in one call, so a caller that only ran it could
neither report progress nor notice that its visitor left until the decode ended (Min Lookahead takes tens of
seconds). Here the decode runs in a thread and the generator hands out a Progress every `poll` seconds. Closing
the generator (Stop, Gradio closing the job of a page that went away, the decode slot taking over an abandoned
run) stops the running decode at its next step (task.StopCheck) and waits for its thread, so when close() returns
no decode is running and its caches are gone -- or, should a step outlast JOIN_WAIT seconds, close() returns anyway
and `busy()` says the thread still runs: one decode that ignores its stop check must not block whoever closes it
(the decode slot counts a transcription whose thread runs as computing, so no other run starts beside it).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

from ..runtime.models import hold
from .audio import Clip
from .models import resident_whisper
from .options import WhisperOptions
from .task import Cancelled, transcribe
from .trace import WhisperTrace

POLL = 1.0  # seconds between progress reports while a decoder runs (also how soon a closed page is noticed)
JOIN_WAIT = 10.0  # seconds closing waits for a decode thread to reach its stop check (a step takes well under one)


@dataclass(frozen=True)
class Progress:
    phase: str       # "loading" (the model) | "decoding"
    index: int       # which decoder (0-based) of `total`
    total: int
    label: str       # the decoder's label, or the model's name while loading
    seconds: float   # since this phase began


def transcribe_each(clip: Clip, options: list[WhisperOptions], poll: float | None = None) -> "Transcription":
    """Load the model (held until the transcription ends), then each decoder in turn: Progress while it runs, then
    its WhisperTrace. Errors of a decode (OptionsError, ModelError, ...) are raised here, in the caller's thread."""
    return Transcription(clip, options, POLL if poll is None else poll)


class Transcription:
    """transcribe_each's items (an iterator that can be closed, like a generator), and `busy()`: whether one of its
    decode threads still runs."""

    def __init__(self, clip: Clip, options: list[WhisperOptions], poll: float):
        self._threads: list[threading.Thread] = []
        self._items = self._each(clip, options, poll)

    def __iter__(self) -> "Transcription":
        return self

    def __next__(self) -> Progress | WhisperTrace:
        return next(self._items)

    def close(self) -> None:
        self._items.close()

    def busy(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _each(self, clip: Clip, options: list[WhisperOptions], poll: float) -> Iterator[Progress | WhisperTrace]:
        if not options:
            return
        for opts in options:
            opts.validate()
        yield Progress("loading", 0, len(options), options[0].model, 0.0)
        loaded = resident_whisper(options[0].model)
        with hold(loaded):
            for index, opts in enumerate(options):
                yield from self._one(clip, opts, index, len(options), poll)

    def _one(self, clip: Clip, options: WhisperOptions, index: int, total: int, poll: float
             ) -> Iterator[Progress | WhisperTrace]:
        stop, outcome = threading.Event(), {}

        def work():
            try:
                outcome["trace"] = transcribe(clip, options, should_stop=stop.is_set)
            except BaseException as err:  # handed to the caller's thread below
                outcome["error"] = err

        worker = threading.Thread(target=work, name=f"whisper-{options.decoder}", daemon=True)
        self._threads = [worker]
        start = time.monotonic()
        worker.start()
        try:
            while worker.is_alive():
                worker.join(timeout=poll)
                if worker.is_alive():
                    yield Progress("decoding", index, total, options.label, time.monotonic() - start)
        finally:  # closed early (or the caller raised): stop the decode at its next step and wait for it, bounded
            stop.set()
            worker.join(timeout=JOIN_WAIT)
        error = outcome.get("error")
        if isinstance(error, Cancelled):
            return
        if error is not None:
            raise error
        yield outcome["trace"]
