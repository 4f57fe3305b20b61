"""Audio in: a file (wav/flac/ogg/mp3 via libsndfile) or a microphone array -> 16 kHz mono float32, checked.

No ffmpeg: openai-whisper only needs it to read files, and we hand it samples. One clip is one Whisper window,
so clips longer than MAX_SECONDS are refused (SpecLab draws one beam search per clip, not a long-form pass).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000          # what Whisper's mel front end expects
MAX_SECONDS = 30.0            # one Whisper window (whisper.audio.CHUNK_LENGTH)
MIN_SECONDS = 0.1
SILENCE_PEAK = 1e-3           # peak |amplitude| below this (on a [-1, 1] scale) counts as silence
FILE_TYPES = (".wav", ".flac", ".ogg", ".mp3")


class AudioError(ValueError):
    """Audio that cannot be transcribed; the message says why and what to do instead."""


@dataclass(frozen=True)
class Clip:
    samples: np.ndarray  # (n,) float32 in [-1, 1] at SAMPLE_RATE
    source_rate: int     # the rate it arrived in (resampled when different)
    name: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def load_file(path: str | Path) -> Clip:
    """Read an audio file and prepare it; AudioError for anything that is not usable speech audio."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise AudioError(f"no such audio file: {path}")
    if path.suffix.lower() == ".mp3" and "MP3" not in sf.available_formats():
        raise AudioError(f"this libsndfile ({sf.__libsndfile_version__}) cannot read MP3; "
                         "convert the file to wav/flac/ogg, or install libsndfile >= 1.1")
    try:
        with sf.SoundFile(str(path)) as handle:
            if handle.frames > handle.samplerate * MAX_SECONDS * 2:  # refuse before reading 10 minutes into memory
                raise _too_long(handle.frames / handle.samplerate)
            data = handle.read(dtype="float32", always_2d=True)  # (frames, channels)
            rate = handle.samplerate
    except AudioError:
        raise
    except Exception:  # soundfile raises LibsndfileError / RuntimeError / TypeError for non-audio bytes
        raise AudioError(f"{path.name} is not an audio file SpecLab can read "
                         f"(supported: {', '.join(FILE_TYPES)})") from None
    return prepare(data, rate, path.name)


def prepare(data: np.ndarray, rate: int, name: str = "microphone") -> Clip:
    """Any (frames,) or (frames, channels) array at any rate -> a checked Clip at 16 kHz mono."""
    samples = _to_float(np.asarray(data))
    if samples.ndim == 2:
        samples = samples.mean(axis=1)  # (frames,): mono by averaging channels
    if samples.ndim != 1:
        raise AudioError(f"audio must be (samples,) or (samples, channels), got shape {samples.shape}")
    if rate <= 0:
        raise AudioError(f"sample rate must be positive, got {rate}")
    if len(samples) == 0:
        raise AudioError("the audio is empty (0 samples); record or upload some speech")
    seconds = len(samples) / rate
    if seconds > MAX_SECONDS:
        raise _too_long(seconds)
    if seconds < MIN_SECONDS:
        raise AudioError(f"the audio is only {seconds * 1000:.0f} ms long; give at least {MIN_SECONDS:.1f} s of speech")
    if not np.all(np.isfinite(samples)):
        raise AudioError("the audio contains NaN or infinite samples")
    if np.abs(samples).max() < SILENCE_PEAK:
        raise AudioError("the audio is silent (peak below -60 dBFS); check the microphone or the file")
    return Clip(resample(samples, rate).astype(np.float32), int(rate), name)


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Polyphase resampling to 16 kHz (scipy's resample_poly: anti-aliasing FIR, exact rational ratio)."""
    if rate == SAMPLE_RATE:
        return samples
    from scipy.signal import resample_poly

    common = gcd(int(rate), SAMPLE_RATE)
    return resample_poly(samples, SAMPLE_RATE // common, int(rate) // common)


def _to_float(data: np.ndarray) -> np.ndarray:
    """Integer PCM (what a browser microphone gives Gradio) -> float32 in [-1, 1]."""
    if np.issubdtype(data.dtype, np.integer):
        info = np.iinfo(data.dtype)
        middle = (int(info.max) + int(info.min) + 1) / 2  # 0 for signed PCM, 128 for unsigned 8-bit
        return ((data.astype(np.float64) - middle) / (info.max + 1 - middle)).astype(np.float32)
    if np.issubdtype(data.dtype, np.floating):
        return data.astype(np.float32)
    raise AudioError(f"audio samples must be numbers, got dtype {data.dtype}")


def _too_long(seconds: float) -> AudioError:
    return AudioError(f"the audio is {seconds:.1f} s long; SpecLab transcribes one Whisper window, at most "
                      f"{MAX_SECONDS:.0f} s: trim the clip")
