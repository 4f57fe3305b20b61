"""Run one clip through a traced decoder: a DecodingTask subclass that swaps in our TokenDecoder.

This is the clean seam openai-whisper offers: decode() has no decoder argument (and DecodingOptions is frozen), and
patching whisper.decoding.BeamSearchDecoder would be process-wide and not thread-safe; so we subclass DecodingTask,
call its __init__, then replace self.decoder (no global state: safe for concurrent Gradio requests). Options that whisper itself knows go through its
DecodingOptions; the reconstructions' knobs go to our decoders' constructors.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from whisper.decoding import DecodingOptions, DecodingTask, LogitFilter

from ..runtime.models import hold
from ..options import OptionsError
from .audio import Clip
from .models import entry, resident_whisper
from .options import WhisperOptions
from .trace import FinalCandidate, WhisperTrace


class Cancelled(Exception):
    """A transcription stopped between two steps because its caller asked (Stop, a closed page)."""


class StopCheck(LogitFilter):
    """Not a filter: whisper calls every logit filter once per step (and our rollouts call them too), which makes
    this the one public place to end a decode between two steps. Raising here unwinds DecodingTask's main loop,
    whose `finally` drops its key/value cache. `steps` counts the calls (progress for the caller)."""

    def __init__(self, should_stop: Callable[[], bool]):
        self.should_stop, self.steps = should_stop, 0

    def apply(self, logits, tokens) -> None:
        self.steps += 1
        if self.should_stop():
            raise Cancelled("stopped")


class TracedTask(DecodingTask):
    def __init__(self, model, options: WhisperOptions, should_stop: Callable[[], bool] | None = None):
        super().__init__(model, decoding_options(options))
        self.decoder = make_decoder(self, options)
        self.stop_check = StopCheck(should_stop or (lambda: False))
        self.logit_filters = [self.stop_check, *self.logit_filters]
        self.audio_features: torch.Tensor | None = None  # (1, n_audio_ctx, d): set by transcribe, read by rollouts


def decoding_options(options: WhisperOptions) -> DecodingOptions:
    """What whisper itself needs; fp16 off (decode() does not switch it off on CPU), no timestamps (one window)."""
    beams = options.spec.beams
    return DecodingOptions(language=options.language, beam_size=options.beam_size if beams else None,
                           patience=options.patience if beams else None,
                           length_penalty=options.length_penalty, sample_len=options.sample_len,
                           without_timestamps=True, fp16=False)


def make_decoder(task: DecodingTask, options: WhisperOptions):
    return options.spec.build(task, options)  # decoders/whisper/registry.py


def mel_for(model, clip: Clip) -> torch.Tensor:
    """(n_mels, 3000): one zero-padded 30 s window, computed as whisper.transcribe does."""
    mel = log_mel_spectrogram(torch.from_numpy(clip.samples), model.dims.n_mels, padding=N_SAMPLES)
    return pad_or_trim(mel[:, :N_FRAMES], N_FRAMES)


def transcribe(clip: Clip, options: WhisperOptions, decoder=None,
               should_stop: Callable[[], bool] | None = None) -> WhisperTrace:
    """Decode one clip with one decoder and return its trace. `decoder` overrides make_decoder (tests).
    `should_stop` is asked once per step; when it says yes the decode raises Cancelled (its caches freed)."""
    options.validate()
    if options.language != "en" and not entry(options.model).multilingual:
        raise OptionsError(f"{options.model} is English-only; choose whisper-base for language {options.language!r}")
    loaded = resident_whisper(options.model)
    with hold(loaded):  # no other load evicts it while it decodes
        task = TracedTask(loaded.model, options, should_stop)
        if decoder is not None:
            task.decoder = decoder(task)
        start = time.perf_counter()  # the encoder counts in the decode time, as it does in whisper.decode
        with torch.no_grad():
            task.audio_features = loaded.model.embed_audio(mel_for(loaded.model, clip)[None])  # (1, n_audio_ctx, d)
        result = task.run(task.audio_features)[0]  # whisper skips its encoder when handed encoded features
        seconds = time.perf_counter() - start
    return build_trace(task, result, options, clip, seconds)


def build_trace(task: TracedTask, result, options: WhisperOptions, clip: Clip, seconds: float) -> WhisperTrace:
    recorder = task.decoder.recorder
    final = ranked_final(task)
    return WhisperTrace(
        decoder=options.decoder, label=options.label, options=options.to_dict(), model=options.model,
        language=options.language, audio={"name": clip.name, "seconds": round(clip.seconds, 3),
                                          "source_rate": clip.source_rate},
        prefix_ids=list(task.initial_tokens), nodes=recorder.nodes, steps=recorder.steps, final=final,
        output_ids=list(result.tokens), output_text=result.text, seconds=seconds,
        rollout_forwards=recorder.rollout_forwards,
        stop_reason="sample_len" if len(recorder.steps) >= task.sample_len else "finished")


def ranked_final(task: TracedTask) -> list[FinalCandidate]:
    """finalize()'s candidates with Whisper's MaximumLikelihoodRanker score, best first (stable on ties)."""
    eot, penalty = task.tokenizer.eot, task.options.length_penalty
    candidates = []
    for (node, padded), (ids, logprob) in zip(task.decoder.final_nodes, task.decoder.final_candidates):
        text_ids = ids[task.sample_begin:ids.index(eot)]
        length = len(text_ids)
        norm = length if penalty is None else ((5 + length) / 6) ** penalty
        candidates.append(FinalCandidate(node, text_ids, task.tokenizer.decode(text_ids).strip(), logprob, length,
                                         logprob / norm, padded))
    return sorted(candidates, key=lambda c: c.normalised, reverse=True)
