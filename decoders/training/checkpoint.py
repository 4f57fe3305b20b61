"""A training run that survives being killed: model, optimizer, step, data position and RNG in one file.

The shared loop (loop.fit) writes the checkpoint every few minutes of wall time and when it stops; `--resume`
reads it back and the run continues exactly where it was: the same next batch, the same noise, the same learning
rate. A checkpoint is written to a temporary file next to it and renamed over it (os.replace is atomic on one file
system), so a run killed mid-write leaves the previous checkpoint whole.

What is "the data position" is the drafter's business: anything with state_dict() / load_state_dict() passed as a
part (the module, its batch stream) is saved under its name.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict): ...


class CheckpointError(ValueError):
    """A checkpoint that is missing or belongs to another run; the message says what to do."""


@dataclass
class Checkpointing:
    """Where and how often a run saves itself. resume: continue from `path` (it must exist)."""

    path: Path
    every_minutes: float = 5.0
    resume: bool = False
    parts: dict[str, Stateful] = field(default_factory=dict)  # e.g. {"model": head, "data": stream}
    kind: str = ""  # which drafter: a resumed run must be the same kind
    meta: dict = field(default_factory=dict)  # what rebuilds the model from the file (vocab ids, shape, target)

    def __post_init__(self):
        self.path = Path(self.path)
        if self.resume and not self.path.is_file():
            raise CheckpointError(f"--resume: no checkpoint at {self.path} (start without --resume to create one)")


def rng_state() -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_atomic(state: dict, path: Path) -> None:
    """torch.save to path.tmp, flushed to disk, then renamed over path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_checkpoint(path: Path, kind: str = "") -> dict:
    """The saved state (on the CPU); checks that it is a training checkpoint of this kind."""
    try:
        state = torch.load(Path(path), map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as error:
        raise CheckpointError(f"cannot read the checkpoint {path}: {error}") from None
    if not isinstance(state, dict) or "optimizer" not in state or "parts" not in state:
        raise CheckpointError(f"{path} is not a training checkpoint (no optimizer / parts)")
    if kind and state.get("kind") and state["kind"] != kind:
        raise CheckpointError(f"{path} is a {state['kind']} checkpoint, not {kind}")
    return state


def checkpoint_state(checkpointing: Checkpointing, optimizer, history, elapsed: float, settings) -> dict:
    parts = {name: part.state_dict() for name, part in checkpointing.parts.items()}
    return {"kind": checkpointing.kind, "meta": checkpointing.meta, "parts": parts,
            "optimizer": optimizer.state_dict(), "history": history, "elapsed": elapsed, "rng": rng_state(),
            "settings": settings, "written": time.time()}


def restore(checkpointing: Checkpointing, optimizer, state: dict) -> tuple:
    """Loads parts, optimizer and RNG from `state`; returns (history, training seconds so far)."""
    for name, part in checkpointing.parts.items():
        if name not in state["parts"]:
            raise CheckpointError(f"{checkpointing.path} has no saved {name!r} (it holds {sorted(state['parts'])})")
        part.load_state_dict(state["parts"][name])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return state["history"], float(state["elapsed"])


def add_checkpoint_arguments(parser) -> None:
    """The options every resumable trainer takes (python -m decoders.eagle / decoders.selfdraft train)."""
    parser.add_argument("--checkpoint", default=None, help="training state file (model, optimizer, step, data "
                        "position, RNG), written every --checkpoint-every minutes and at the end")
    parser.add_argument("--checkpoint-every", type=float, default=5.0, help="minutes")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --checkpoint")
    parser.add_argument("--session-minutes", type=float, default=0.0,
                        help="end this session after this long (the run stays resumable; 0: run to the budget)")


def resume_command(command: str) -> str:
    """The command line that continues a checkpointed run: the same one, with --resume."""
    return command if " --resume" in f"{command} " else f"{command} --resume"
