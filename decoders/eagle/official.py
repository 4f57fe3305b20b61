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
  it. EAGLE-3 heads (cnets.py, `use_eagle3=True`) are a different model, head3.Eagle3Head: keys `fc.weight` (d, 3d,
  no bias), `midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight`, `midlayer.self_attn.
  {q,k,v}_proj.weight` (reading 2d), `o_proj`, `midlayer.mlp.*`, `norm.weight`, `lm_head.weight` (N, d), `d2t` (N,),
  `t2d` (V,); config.json adds "draft_vocab_size". Told apart by the `midlayer.` keys. SafeAILab fixes the fused
  layers at (2, L // 2, L - 3); a head of ours that fuses others names them in config["speclab"]["feature_layers"].

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
from .head3 import Eagle3Head

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")  # EAGLE's own order of preference
SHARED_KEYS = ("embed_tokens.weight",)
VOCAB_KEY = "vocab_ids"
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


class EagleHeadError(ValueError):
    """A head that cannot be found, read or matched to its target; the message says what to do."""


# ---------------------------------------------------------------------------------------------- writing

def official_config(head: EagleHead | Eagle3Head, extra: dict | None = None) -> dict:
    """config.json as EAGLE's EConfig reads it: the target's config cut to one layer, plus "bias"/"qkv_bias"
    (EAGLE-1/2) or "draft_vocab_size" (EAGLE-3, always written: SafeAILab's cnets.Model needs it)."""
    config = head.config.to_dict()
    config["num_hidden_layers"] = 1
    config["architectures"] = [_ARCHITECTURES.get(config.get("model_type"), "LlamaForCausalLM")]
    if head.arch == "eagle3":
        config["draft_vocab_size"] = head.vocab_size
        config["speclab"] = dict(extra or {}, arch="eagle3", feature_layers=list(head.feature_layers),
                                 written_by="SpecLab decoders/eagle")
        return config
    config["bias"] = head.fc.bias is not None
    q_proj = head.layers[0].self_attn.q_proj
    if getattr(q_proj, "bias", None) is not None:
        config["qkv_bias"] = True
    if head.vocab_ids is not None:
        config["draft_vocab_size"] = head.vocab_size
    config["speclab"] = dict(extra or {}, written_by="SpecLab decoders/eagle")  # ignored by EAGLE's EConfig
    return config


def save_official(head: EagleHead | Eagle3Head, folder: str | Path, dtype: torch.dtype | None = None,
                  extra: dict | None = None) -> Path:
    """Write config.json + model.safetensors (head weights only; dtype e.g. torch.float16 to ship small)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to("cpu", dtype or value.dtype).contiguous() for key, value in head.state_dict().items()}
    if head.arch == "eagle1" and head.vocab_ids is not None:  # EAGLE-3 keeps its vocabulary as d2t/t2d weights
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

def load_official(source: str | Path, target: torch.nn.Module) -> EagleHead | Eagle3Head:
    """A head for `target` from a local folder in EAGLE's layout or a hub id ("yuhuili/EAGLE-..."): EAGLE-1/2's
    or EAGLE-3's, told apart by its weights."""
    folder = resolve_folder(source)
    config = read_config(folder)
    check_matches_target(config, target, source)
    state = read_weights(folder)
    if is_eagle3(state):
        return load_eagle3(config, state, target)
    head = EagleHead(target, bias=bool(config.get("bias", True)))
    load_official_state(head, state)
    return head


def is_eagle3(state: dict[str, torch.Tensor]) -> bool:
    return any(key.startswith("midlayer.") for key in state)


def load_eagle3(config: dict, state: dict[str, torch.Tensor], target: torch.nn.Module) -> Eagle3Head:
    """An EAGLE-3 head, loaded strictly (the same extra keys as EAGLE-1/2 may be dropped). A full-vocabulary head
    may come without d2t/t2d (SafeAILab deletes them when draft_vocab_size equals vocab_size)."""
    state = _without_shared(state)
    vocab = int(getattr(getattr(target.config, "text_config", None) or target.config, "vocab_size"))
    draft = int(config.get("draft_vocab_size", vocab))
    if "d2t" not in state and draft == vocab:
        state["d2t"], state["t2d"] = torch.zeros(vocab, dtype=torch.long), torch.ones(vocab, dtype=torch.bool)
    if "d2t" not in state or state["d2t"].numel() != draft:
        raise EagleHeadError(f"an EAGLE-3 head needs d2t with draft_vocab_size ({draft}) entries; this one has "
                             f"{'none' if 'd2t' not in state else state['d2t'].numel()}")
    ids = torch.arange(draft) + state["d2t"].long()  # (N,) target ids
    layers = (config.get("speclab") or {}).get("feature_layers")
    try:
        head = Eagle3Head(target, vocab_ids=ids, feature_layers=tuple(layers) if layers else None)
    except ValueError as error:
        raise EagleHeadError(f"not an EAGLE-3 head for this target: {error}") from None
    _load_strict(head, state, "EAGLE-3")
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
    if is_eagle3(state) or "d2t" in state:
        raise EagleHeadError("these are EAGLE-3 weights (midlayer.*, d2t); load them with load_official")
    state = _without_shared(state)
    vocab_ids = state.pop(VOCAB_KEY, None)
    head.set_draft_vocab(vocab_ids)
    _load_strict(head, state, "EAGLE-1/2")


def _without_shared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The keys a head may legitimately carry but we do not load: the embedding (EAGLE overwrites it with the
    target's too) and RoPE inv_freq buffers (recomputed from the config)."""
    return {k: v for k, v in state.items() if k not in SHARED_KEYS and not k.endswith("rotary_emb.inv_freq")}


def _load_strict(head, state: dict[str, torch.Tensor], kind: str) -> None:
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise EagleHeadError(f"not an {kind} head for this target: missing {missing[:6]}, unexpected "
                             f"{unexpected[:6]}")
    wrong = [k for k in expected if tuple(state[k].shape) != tuple(expected[k].shape)]
    if wrong:
        raise EagleHeadError(f"EAGLE head shapes do not match this target: {wrong[0]} is "
                             f"{tuple(state[wrong[0]].shape)}, expected {tuple(expected[wrong[0]].shape)}")
    reference = head.fc.weight
    head.load_state_dict({k: v.to(reference.device, reference.dtype if v.is_floating_point() else v.dtype)
                          for k, v in state.items()}, strict=True)
