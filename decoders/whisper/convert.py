"""CTranslate2 Whisper weights -> an openai-whisper checkpoint ({"dims": ..., "model_state_dict": ...}).

The tensor-name mapping: CTranslate2 names a layer's tensors "<side>/layer_<i>/<block>/linear_<j>/weight" and fuses
Q|K|V (self-attention) and K|V (cross-attention) into one Linear each, with a bias for the key part that
openai-whisper's key Linear does not have: the converter drops it only after checking it is zero. Weights stay in
the file's precision (float16 here); whisper.load_model copies them into float32 parameters.

What openai-whisper's model cannot express is refused, not silently dropped (ConversionError): the decoder flags
(scaled or ALiBi embeddings, post-norm, a zero start embedding, an activation other than GELU), an output projection
that is not the token embedding (Whisper ties them), a non-zero key bias, and int8 weights without their
per-row scales. int8 weights with scales (CTranslate2's int8 quantization) are dequantised: weight / scale.
"""
from __future__ import annotations

import numpy as np
import torch

SPEC_NAME = "WhisperSpec"
_NORM = {"gamma": "weight", "beta": "bias"}
GELU = 3  # CTranslate2's ActivationType enum: RELU 0, GELUTanh 1, SWISH 2, GELU 3 (Whisper's)
# decoder flags openai-whisper's TextDecoder hard-codes: the value it implies for each (a missing flag is that value)
DECODER_FLAGS = {"scale_embeddings": 0, "alibi": 0, "pre_norm": 1, "start_from_zero_embedding": 0, "activation": GELU}


class ConversionError(ValueError):
    """The CTranslate2 file does not hold a Whisper model of the expected layout."""


def to_whisper_checkpoint(spec: str, variables: dict[str, np.ndarray]) -> dict:
    """The checkpoint dict whisper.load_model reads (strictly) from the variables of a CTranslate2 WhisperSpec."""
    if spec != SPEC_NAME:
        raise ConversionError(f"expected a CTranslate2 {SPEC_NAME}, got {spec!r}")
    check_supported(variables)
    variables = dequantised(variables)
    dims = model_dims(variables)
    state: dict[str, torch.Tensor] = {}
    _encoder(variables, dims["n_audio_layer"], state)
    _decoder(variables, dims["n_text_layer"], state)
    return {"dims": dims, "model_state_dict": state}


def check_supported(v: dict[str, np.ndarray]) -> None:
    """Refuse a file whose decoder differs from openai-whisper's in a way the state dict cannot carry."""
    for flag, whisper_value in DECODER_FLAGS.items():
        value = v.get(f"decoder/{flag}")
        if value is not None and int(value) != whisper_value:
            raise ConversionError(f"decoder/{flag} is {int(value)}, but openai-whisper's decoder implies "
                                  f"{whisper_value}: this model cannot be converted faithfully")
    projection = v.get("decoder/projection/weight")
    if projection is not None and not np.array_equal(projection, v["decoder/embeddings/weight"]):
        raise ConversionError("decoder/projection/weight differs from the token embedding; openai-whisper ties them")


def dequantised(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """int8 weights back to float32 with their per-row scales (CTranslate2 stores round(weight * scale)); an int8
    weight without a scale cannot be read, so it is refused."""
    out = dict(v)
    for name, array in v.items():
        if not name.endswith("/weight") or array.dtype not in (np.int8, np.int16):
            continue
        scale = v.get(name + "_scale")
        if scale is None:
            raise ConversionError(f"{name} is {array.dtype} without {name}_scale: quantised weights need their "
                                  "scales; use a float16 or float32 model")
        scale = np.asarray(scale, dtype=np.float32)
        out[name] = array.astype(np.float32) / (scale.reshape(-1, *[1] * (array.ndim - 1)) if scale.ndim else scale)
        del out[name + "_scale"]
    return out


def _zero_or_refuse(bias_part: np.ndarray, name: str) -> None:
    if np.any(bias_part):
        raise ConversionError(f"{name}: the key bias is not zero (max |b| {float(np.abs(bias_part).max()):.3g}); "
                              "openai-whisper's key Linear has no bias, so dropping it would change the model")


def model_dims(v: dict[str, np.ndarray]) -> dict[str, int]:
    """ModelDimensions as a plain dict (load_model unpickles with weights_only=True: no dataclass objects)."""
    embed = v["decoder/embeddings/weight"]  # (n_vocab, n_text_state)
    return {
        "n_mels": int(v["encoder/conv1/weight"].shape[1]),
        "n_audio_ctx": int(v["encoder/position_encodings/encodings"].shape[0]),
        "n_audio_state": int(v["encoder/conv1/weight"].shape[0]),
        "n_audio_head": int(v["encoder/num_heads"]),
        "n_audio_layer": _count_layers(v, "encoder"),
        "n_vocab": int(embed.shape[0]),
        "n_text_ctx": int(v["decoder/position_encodings/encodings"].shape[0]),
        "n_text_state": int(embed.shape[1]),
        "n_text_head": int(v["decoder/num_heads"]),
        "n_text_layer": _count_layers(v, "decoder"),
    }


def _count_layers(v: dict, side: str) -> int:
    count = 0
    while f"{side}/layer_{count}/ffn/linear_0/weight" in v:
        count += 1
    if count == 0:
        raise ConversionError(f"no {side} layers found: not a Whisper model")
    return count


def _t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array))  # a copy: the source buffer is read-only


def _encoder(v: dict, n_layers: int, out: dict) -> None:
    for conv in ("conv1", "conv2"):
        out[f"encoder.{conv}.weight"] = _t(v[f"encoder/{conv}/weight"])
        out[f"encoder.{conv}.bias"] = _t(v[f"encoder/{conv}/bias"])
    out["encoder.positional_embedding"] = _t(v["encoder/position_encodings/encodings"])
    for i in range(n_layers):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        _self_attention(v, src, dst, out)
        _ffn(v, src, dst, out)
    _norm(v, "encoder/layer_norm", "encoder.ln_post", out)


def _decoder(v: dict, n_layers: int, out: dict) -> None:
    out["decoder.token_embedding.weight"] = _t(v["decoder/embeddings/weight"])  # also the tied output projection
    out["decoder.positional_embedding"] = _t(v["decoder/position_encodings/encodings"])
    for i in range(n_layers):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        _self_attention(v, src, dst, out)
        _cross_attention(v, src, dst, out)
        _ffn(v, src, dst, out)
    _norm(v, "decoder/layer_norm", "decoder.ln", out)


def _self_attention(v: dict, src: str, dst: str, out: dict) -> None:
    weight = v[f"{src}/self_attention/linear_0/weight"]  # (3d, d): Q | K | V
    bias = v[f"{src}/self_attention/linear_0/bias"]      # (3d,): the K third is zero
    q_w, k_w, v_w = np.split(weight, 3)
    q_b, k_b, v_b = np.split(bias, 3)
    _zero_or_refuse(k_b, f"{src}/self_attention/linear_0/bias")
    out.update({f"{dst}.attn.query.weight": _t(q_w), f"{dst}.attn.query.bias": _t(q_b),
                f"{dst}.attn.key.weight": _t(k_w),
                f"{dst}.attn.value.weight": _t(v_w), f"{dst}.attn.value.bias": _t(v_b)})
    _linear(v, f"{src}/self_attention/linear_1", f"{dst}.attn.out", out)
    _norm(v, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln", out)


def _cross_attention(v: dict, src: str, dst: str, out: dict) -> None:
    _linear(v, f"{src}/attention/linear_0", f"{dst}.cross_attn.query", out)
    k_w, v_w = np.split(v[f"{src}/attention/linear_1/weight"], 2)  # (2d, d): K | V
    k_b, v_b = np.split(v[f"{src}/attention/linear_1/bias"], 2)
    _zero_or_refuse(k_b, f"{src}/attention/linear_1/bias")
    out.update({f"{dst}.cross_attn.key.weight": _t(k_w),
                f"{dst}.cross_attn.value.weight": _t(v_w), f"{dst}.cross_attn.value.bias": _t(v_b)})
    _linear(v, f"{src}/attention/linear_2", f"{dst}.cross_attn.out", out)
    _norm(v, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln", out)


def _ffn(v: dict, src: str, dst: str, out: dict) -> None:
    _linear(v, f"{src}/ffn/linear_0", f"{dst}.mlp.0", out)
    _linear(v, f"{src}/ffn/linear_1", f"{dst}.mlp.2", out)
    _norm(v, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln", out)


def _linear(v: dict, src: str, dst: str, out: dict) -> None:
    out[f"{dst}.weight"] = _t(v[f"{src}/weight"])
    out[f"{dst}.bias"] = _t(v[f"{src}/bias"])


def _norm(v: dict, src: str, dst: str, out: dict) -> None:
    for ct2_name, torch_name in _NORM.items():
        out[f"{dst}.{torch_name}"] = _t(v[f"{src}/{ct2_name}"])
