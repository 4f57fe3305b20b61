"""The one save/load format of the learned self-drafters: a folder with config.json (kind, shape, training record)
and model.safetensors (the module's own weights, plus vocab_ids when the draft vocabulary is reduced).

Shipped weights live in assets/<kind>/<target> (e.g. assets/early-exit/smollm2-135m); `locate` finds them, then
the user cache (~/.cache/speclab/<kind>/<target>), which is where training writes by default.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .heads import ExitBlock, Prophet

ASSETS = Path(__file__).resolve().parents[2] / "assets"
KINDS = ("early-exit", "prophet")


class WeightsMissing(ValueError):
    """No trained weights for this target; the message gives the command that trains them."""


def cache_dir(kind: str, target: str) -> Path:
    from ..runtime.model_files import cache_dir as speclab_cache

    return speclab_cache() / kind / target.replace("/", "--")


def train_command(kind: str, target: str) -> str:
    return f"python -m decoders.selfdraft train --kind {kind} --target {target}"


def locate(kind: str, target: str) -> Path:
    """The shipped folder for `target`, else the trained one in the cache; a clear error naming the command."""
    for folder in (ASSETS / kind / target.replace("/", "--"), cache_dir(kind, target)):
        if (folder / "model.safetensors").exists():
            return folder
    raise WeightsMissing(f"no trained {kind} drafter for {target}: train one with `{train_command(kind, target)}` "
                         f"(it lands in {cache_dir(kind, target)}, where the drafter looks)")


def read_config(kind: str, source: str | Path, target: str) -> dict:
    """config.json of the weights a drafter would load: a folder, or "auto" (shipped or trained for `target`)."""
    folder = locate(kind, target) if source == "auto" else Path(source)
    return json.loads((folder / "config.json").read_text())


def save(module, folder: Path, dtype: torch.dtype = torch.float32, record: dict | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in module.trainable_state().items()}
    if module.vocab.vocab_ids is not None:
        tensors["vocab_ids"] = module.vocab.vocab_ids.cpu().contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    config = module.meta() | _shape_of(module.target) | {"draft_vocab": module.vocab.size, "dtype": str(dtype).removeprefix("torch."),
                              "training": record or {}}
    (folder / "config.json").write_text(json.dumps(config, indent=1, default=str) + "\n")
    return folder


def _shape_of(target) -> dict:
    from ..runtime.runner import decoder_layers

    return {"target_layers": len(decoder_layers(target)), "hidden_size": int(target.config.hidden_size),
            "vocab_size": int(target.config.vocab_size)}


def load(folder: Path, target: torch.nn.Module):
    """An ExitBlock or Prophet over `target` with the saved weights (cast to the target's dtype)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in _shape_of(target).items():
        if key in config and config[key] != value:
            raise ValueError(f"{folder} was trained for a target with {key} {config[key]}; this one has {value}")
    tensors = load_file(str(folder / "model.safetensors"))
    vocab_ids = tensors.pop("vocab_ids", None)
    if config["kind"] == "early-exit":
        module = ExitBlock(target, int(config["exit_layer"]), vocab_ids=vocab_ids)
    elif config["kind"] == "prophet":
        module = Prophet(target, int(config["n_layers"]), vocab_ids=vocab_ids)
    else:
        raise ValueError(f"{folder}: unknown kind {config['kind']!r}; expected one of {KINDS}")
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    own_missing = [k for k in missing if not k.startswith("vocab.")]
    if own_missing or unexpected:
        raise ValueError(f"{folder} does not match this target: missing {own_missing[:3]}, unexpected {unexpected[:3]}")
    module.config_record = config
    return module.eval().requires_grad_(False)
