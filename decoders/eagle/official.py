"""SafeAILab/EAGLE's released head format, read and written, so official EAGLE-1/2 heads load and ours load there.

What that repo saves and loads (eagle/model/ea_model.py + cnets1.py, read for this file):
- a folder (or hub repo) with `config.json` (a LlamaConfig-style dict with num_hidden_layers = 1, plus an
  optional "bias" for fc, default true; Qwen2 heads add "qkv_bias") and the weights in `pytorch_model.bin`
  (tried first) or `model.safetensors`;
- state-dict keys `fc.weight`, `fc.bias`, `layers.0.self_attn.{q,k,v,o}_proj.weight` (+ q/k/v `.bias` with
  qkv_bias), `layers.0.mlp.{gate,up,down}_proj.weight`, `layers.0.post_attention_layernorm.weight`; layer 0 has no
  `input_layernorm`. Some releases also carry `embed_tokens.weight` (EAGLE then overwrites it with the target's
  embedding, `load_emb=True`); EAGLE loads with strict=False.
- EAGLE-1 and EAGLE-2 share this head (cnets1.py, `use_eagle3=False`): EAGLE-2 changed only the tree built from
  it. EAGLE-3 heads (cnets.py: fc over 3 fused features, `midlayer.*`, `norm`, own `lm_head`, `d2t`/`t2d`) are a
  different model and are refused here with a message.

We load strictly: every head weight must be present and nothing unknown may remain, after dropping the two kinds
of keys that are legitimately extra (`embed_tokens.weight`, shared with the target here; RoPE `inv_freq` buffers).
A reduced draft vocabulary is stored as `vocab_ids` (EAGLE's strict=False loader ignores it).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .head import EagleHead

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")  # EAGLE's own order of preference
SHARED_KEYS = ("embed_tokens.weight",)
VOCAB_KEY = "vocab_ids"
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


class EagleHeadError(ValueError):
    """A head that cannot be found, read or matched to its target; the message says what to do."""


# ---------------------------------------------------------------------------------------------- writing

def official_config(head: EagleHead, extra: dict | None = None) -> dict:
    """config.json as EAGLE's EConfig reads it: the target's config cut to one layer, plus "bias"/"qkv_bias"."""
    config = head.config.to_dict()
    config["num_hidden_layers"] = 1
    config["architectures"] = [_ARCHITECTURES.get(config.get("model_type"), "LlamaForCausalLM")]
    config["bias"] = head.fc.bias is not None
    q_proj = head.layers[0].self_attn.q_proj
    if getattr(q_proj, "bias", None) is not None:
        config["qkv_bias"] = True
    if head.vocab_ids is not None:
        config["draft_vocab_size"] = head.vocab_size
    config["speclab"] = dict(extra or {}, written_by="SpecLab decoders/eagle")  # ignored by EAGLE's EConfig
    return config


def save_official(head: EagleHead, folder: str | Path, dtype: torch.dtype | None = None,
                  extra: dict | None = None) -> Path:
    """Write config.json + model.safetensors (head weights only; dtype e.g. torch.float16 to ship small)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to("cpu", dtype or value.dtype).contiguous() for key, value in head.state_dict().items()}
    if head.vocab_ids is not None:
        state[VOCAB_KEY] = head.vocab_ids.detach().cpu().contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(official_config(head, extra), indent=2, default=str) + "\n")
    return folder


# ---------------------------------------------------------------------------------------------- finding

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "eagle"  # heads small enough for git


def trained_head_dir(target_name: str) -> Path:
    """Where `python -m decoders.eagle train` caches a head by default (outside git: heads can exceed 20 MB)."""
    from ..runtime.model_files import cache_dir

    return cache_dir() / "eagle" / _folder_name(target_name)


def locate_head(target_name: str) -> Path:
    """The head folder for a target: the shipped one (assets/eagle/<name>), else the trained cache; else a message
    with the command that trains one."""
    for folder in (SHIPPED_DIR / _folder_name(target_name), trained_head_dir(target_name)):
        if (folder / CONFIG_FILE).is_file():
            return folder
    raise EagleHeadError(f"no EAGLE head for {target_name!r} yet; train one (it is cached for later runs): "
                         f"python -m decoders.eagle train --target {target_name}")


def _folder_name(target_name: str) -> str:
    return str(target_name).strip().replace("/", "--")


# ---------------------------------------------------------------------------------------------- reading

def load_official(source: str | Path, target: torch.nn.Module) -> EagleHead:
    """A head for `target` from a local folder in EAGLE's layout or a hub id ("yuhuili/EAGLE-...")."""
    folder = resolve_folder(source)
    config = read_config(folder)
    check_matches_target(config, target, source)
    state = read_weights(folder)
    head = EagleHead(target, bias=bool(config.get("bias", True)))
    load_official_state(head, state)
    return head


def resolve_folder(source: str | Path) -> Path:
    """A local folder as is; otherwise download config + weights from the hub (with a clear message offline)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    text = str(source)
    if path.exists() or text.count("/") != 1 or text.startswith((".", "/", "~")):
        raise EagleHeadError(f"no EAGLE head folder at {text!r} (expected a folder with config.json and "
                             f"model.safetensors or pytorch_model.bin, or a hub id such as yuhuili/EAGLE-Vicuna-7B-v1.3)")
    return _download(text)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download

        config_path = Path(hf_hub_download(repo_id, CONFIG_FILE))
        for name in WEIGHT_FILES:
            try:
                hf_hub_download(repo_id, name)
                return config_path.parent
            except Exception as missing:  # noqa: BLE001 - try the other file name, as EAGLE does
                last = missing
        raise last
    except Exception as error:  # noqa: BLE001 - offline, unknown repo, no network: one message for all
        raise EagleHeadError(
            f"could not download the EAGLE head {repo_id!r} from the Hugging Face hub "
            f"({type(error).__name__}; offline or no such repo). Pass a local head folder instead, or train one: "
            f"python -m decoders.eagle train --target <model> --out <folder>") from None


def read_config(folder: Path) -> dict:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise EagleHeadError(f"{folder} has no {CONFIG_FILE}; an EAGLE head folder holds config.json and its weights")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise EagleHeadError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    if "draft_vocab_size" in config and "speclab" not in config:
        raise EagleHeadError(f"{folder} looks like an EAGLE-3 head (draft_vocab_size in its config); only "
                             "EAGLE-1/2 heads (use_eagle3=False in SafeAILab/EAGLE) load here")
    return config


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
    raise EagleHeadError(f"{folder} has no {' or '.join(WEIGHT_FILES)}")


def check_matches_target(config: dict, target: torch.nn.Module, source) -> None:
    want = getattr(target.config, "text_config", None) or target.config
    for key in ("hidden_size", "vocab_size"):
        if key in config and int(config[key]) != int(getattr(want, key)):
            raise EagleHeadError(f"the EAGLE head {str(source)!r} was made for a target with {key} {config[key]}, "
                                 f"but this target has {getattr(want, key)}: use the head trained for this model")


def load_official_state(head: EagleHead, state: dict[str, torch.Tensor]) -> None:
    """Strict load of EAGLE's key names into `head` (see the module doc for the keys that may be extra)."""
    state = dict(state)
    if any(key.startswith("midlayer.") for key in state) or "d2t" in state:
        raise EagleHeadError("these are EAGLE-3 weights (midlayer.*, d2t); only EAGLE-1/2 heads load here")
    for key in SHARED_KEYS:
        state.pop(key, None)  # EAGLE overwrites it with the target's embedding too
    for key in [k for k in state if k.endswith("rotary_emb.inv_freq")]:
        state.pop(key)  # recomputed from the config
    vocab_ids = state.pop(VOCAB_KEY, None)
    head.set_draft_vocab(vocab_ids)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise EagleHeadError(f"not an EAGLE-1/2 head for this target: missing {missing[:6]}, unexpected "
                             f"{unexpected[:6]}")
    wrong = [k for k in expected if tuple(state[k].shape) != tuple(expected[k].shape)]
    if wrong:
        raise EagleHeadError(f"EAGLE head shapes do not match this target: {wrong[0]} is "
                             f"{tuple(state[wrong[0]].shape)}, expected {tuple(expected[wrong[0]].shape)}")
    reference = head.fc.weight
    head.load_state_dict({k: v.to(reference.device, reference.dtype) for k, v in state.items()}, strict=True)
