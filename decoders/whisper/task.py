"""Run one clip through a traced decoder: a DecodingTask subclass that swaps in our TokenDecoder.

This is the clean seam openai-whisper offers: decode() has no decoder argument (and DecodingOptions is frozen), and
patching whisper.decoding.BeamSearchDecoder would be process-wide and not thread-safe; so we subclass DecodingTask,
call its __init__, then replace self.decoder (no global state: safe for concurrent Gradio requests). Options that whisper itself knows go through its
DecodingOptions; the reconstructions' knobs go to our decoders' constructors.
"""
from __future__ import annotations

import time

import torch
from whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from whisper.decoding import DecodingOptions, DecodingTask

from ..options import OptionsError
from .audio import Clip
from .models import entry, load_whisper
from .options import WhisperOptions
from .search import EndFilter, Lookahead, TracedBeam, TracedGreedy
from .trace import FinalCandidate, WhisperTrace


class TracedTask(DecodingTask):
    def __init__(self, model, options: WhisperOptions):
        super().__init__(model, decoding_options(options))
        self.decoder = make_decoder(self, options)

    def _get_audio_features(self, mel):
        self.audio_features = super()._get_audio_features(mel)  # (1, n_audio_ctx, d): kept for lookahead rollouts
        return self.audio_features


def decoding_options(options: WhisperOptions) -> DecodingOptions:
    """What whisper itself needs; fp16 off (decode() does not switch it off on CPU), no timestamps (one window)."""
    return DecodingOptions(language=options.language, beam_size=None if options.decoder == "greedy" else options.beam_size,
                           patience=None if options.decoder == "greedy" else options.patience,
                           length_penalty=options.length_penalty, sample_len=options.sample_len,
                           without_timestamps=True, fp16=False)


def make_decoder(task: DecodingTask, options: WhisperOptions):
    if options.decoder == "greedy":
        return TracedGreedy(task)
    end_filter = EndFilter(options.eot_margin) if "filter-ends" in options.decoder else None
    lookahead = Lookahead(options.lookahead_depth, options.lookahead_aggregate) if "lookahead" in options.decoder else None
    return TracedBeam(task, options.beam_size, options.patience, end_filter, lookahead)


def mel_for(model, clip: Clip) -> torch.Tensor:
    """(n_mels, 3000): one zero-padded 30 s window, computed as whisper.transcribe does."""
    mel = log_mel_spectrogram(torch.from_numpy(clip.samples), model.dims.n_mels, padding=N_SAMPLES)
    return pad_or_trim(mel[:, :N_FRAMES], N_FRAMES)


def transcribe(clip: Clip, options: WhisperOptions, decoder=None) -> WhisperTrace:
    """Decode one clip with one decoder and return its trace. `decoder` overrides make_decoder (tests)."""
    options.validate()
    if options.language != "en" and not entry(options.model).multilingual:
        raise OptionsError(f"{options.model} is English-only; choose whisper-base for language {options.language!r}")
    model = load_whisper(options.model)
    task = TracedTask(model, options)
    if decoder is not None:
        task.decoder = decoder(task)
    start = time.perf_counter()
    result = task.run(mel_for(model, clip)[None])[0]
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
