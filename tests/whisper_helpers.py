"""Shared bits of the Whisper tests: the bundled clips, whisper tiny.en (converted once into the cache)."""
from __future__ import annotations

import json
from pathlib import Path

AUDIO = Path(__file__).resolve().parent.parent / "assets" / "audio"
CLIPS = json.loads((AUDIO / "clips.json").read_text())
SHORT_CLIPS = ("librivox-0880.wav", "librivox-0930.wav")  # 3 s each: the fast tests' clips
TINY = "whisper-tiny.en"


def clip(name: str):
    from decoders.whisper.audio import load_file

    return load_file(AUDIO / name)


def tiny_model():
    from decoders.whisper.models import load_whisper

    return load_whisper(TINY)
