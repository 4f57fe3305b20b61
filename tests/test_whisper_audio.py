"""Audio in: formats, resampling, and a clear one-line message for everything unusable."""
from __future__ import annotations

import numpy as np
import pytest

sf = pytest.importorskip("soundfile")

from whisper_helpers import AUDIO  # noqa: E402

from decoders.whisper.audio import MAX_SECONDS, SAMPLE_RATE, AudioError, load_file, prepare  # noqa: E402


def tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bundled_clip_is_16k_mono_float32():
    clip = load_file(AUDIO / "librivox-0880.wav")
    assert clip.samples.dtype == np.float32 and clip.samples.ndim == 1
    assert clip.source_rate == SAMPLE_RATE and 2.5 < clip.seconds < 3.5


@pytest.mark.parametrize("fmt,suffix", [("WAV", ".wav"), ("FLAC", ".flac"), ("OGG", ".ogg"), ("MP3", ".mp3")])
def test_formats_are_read_and_resampled(tmp_path, fmt, suffix):
    if fmt not in sf.available_formats():
        pytest.skip(f"this libsndfile cannot write {fmt}")
    path = tmp_path / f"tone{suffix}"
    sf.write(path, tone(1.0, 44_100), 44_100, format=fmt)
    clip = load_file(path)
    assert clip.source_rate == 44_100
    assert abs(clip.seconds - 1.0) < 0.06  # MP3 adds encoder padding
    assert np.abs(clip.samples).max() > 0.1


def test_wrong_sample_rate_is_resampled_not_rejected():
    clip = prepare(tone(2.0, 8_000, freq=300.0), 8_000)
    assert len(clip.samples) == 2 * SAMPLE_RATE
    spectrum = np.abs(np.fft.rfft(clip.samples))                    # the tone stays at 300 Hz after resampling
    assert abs(np.argmax(spectrum) * SAMPLE_RATE / len(clip.samples) - 300.0) < 2.0


def test_microphone_int16_stereo_becomes_mono_float():
    pcm = (np.stack([tone(1.0, 48_000)] * 2, axis=1) * 32767).astype(np.int16)  # (frames, 2)
    clip = prepare(pcm, 48_000)
    assert clip.samples.ndim == 1 and clip.samples.dtype == np.float32
    assert 0.25 < np.abs(clip.samples).max() < 0.35


def test_empty_audio(tmp_path):
    with pytest.raises(AudioError) as err:
        prepare(np.zeros(0, dtype=np.float32), SAMPLE_RATE)
    assert "empty" in one_line(err)
    path = tmp_path / "empty.wav"
    sf.write(path, np.zeros(0, dtype=np.float32), SAMPLE_RATE)
    with pytest.raises(AudioError) as err:
        load_file(path)
    assert "empty" in one_line(err)


def test_silent_audio():
    with pytest.raises(AudioError) as err:
        prepare(np.zeros(SAMPLE_RATE * 2, dtype=np.float32), SAMPLE_RATE)
    assert "silent" in one_line(err)


def test_ten_minutes_is_refused_before_reading(tmp_path):
    path = tmp_path / "long.wav"
    sf.write(path, np.zeros(10 * 60 * 8_000, dtype=np.int16), 8_000, subtype="PCM_16")
    with pytest.raises(AudioError) as err:
        load_file(path)
    assert "600.0 s" in one_line(err) and f"{MAX_SECONDS:.0f} s" in str(err.value)


def test_just_over_the_limit_from_a_microphone():
    with pytest.raises(AudioError) as err:
        prepare(tone(MAX_SECONDS + 1, SAMPLE_RATE), SAMPLE_RATE)
    assert "trim" in one_line(err)


def test_text_file_renamed_wav(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio\n" * 50)
    with pytest.raises(AudioError) as err:
        load_file(path)
    assert "not an audio file" in one_line(err) and "notes.wav" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(AudioError) as err:
        load_file(tmp_path / "nope.wav")
    assert "no such audio file" in one_line(err)


def test_too_short_and_non_finite():
    with pytest.raises(AudioError, match="only 50 ms"):
        prepare(tone(0.05, SAMPLE_RATE), SAMPLE_RATE)
    broken = tone(1.0, SAMPLE_RATE)
    broken[10] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        prepare(broken, SAMPLE_RATE)
