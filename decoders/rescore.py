"""One position of a run scored exactly: the target's logits after a prefix, computed in float64.

decoders/compare.py needs to know, where a run and its baseline chose different tokens, which of the two the target
really prefers and by how much. Both runs computed their logits in the run's dtype, each in its own summation order;
a float64 forward of the same weights on the same prefix is the referee (float64 rounding is ~1e-16 relative, far
below any float32 or bfloat16 disagreement).

Memory: a float64 copy of the whole target would cost twice its float32 weights (Qwen2.5-Coder-1.5B: 12 GB beside
its 6 GB copy), so the forward runs one decoder layer at a time, each cast to float64 on the fly and dropped after
use; the LM head is applied in row chunks. The peak is one layer in float64 (Qwen 1.5B: ~0.4 GB) plus one chunk of
the head. Packed weights (decoders/runtime/kernels.py) are read back dense; int8 ones dequantized (what that model computes
with). The loaded model itself is never modified, so a run may use it at the same time.

It also times nothing and needs no cache: one forward over the prefix, no KV kept. `noise_sample` gives the other
half of the referee: what a correct forward in the run's own dtype gets wrong at that position (compare.py judges a
run's error against it).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from .runtime import kernels
from .runtime.runner import decoder_layers
from .selfdraft.stem import Rotary, causal_mask

HEAD_CHUNK = 8192  # LM-head rows cast to float64 at a time (8192 x 1536 x 8 bytes = 100 MB for Qwen 1.5B)
NOISE_TOKENS = 16  # how many of the exact row's best tokens the same-dtype forward is measured on


@dataclass(frozen=True)
class Rescore:
    """The exact (float64) logits of some tokens at one position, and what the run's dtype gets wrong there."""

    exact: dict[int, float]  # token id -> float64 logit
    noise: float  # max |logit in the run's dtype - exact| over the exact row's best NOISE_TOKENS, one prefill forward
    dtype: str  # the run's dtype the noise was measured in


def rescore(model: nn.Module, prefix: list[int], tokens: list[int]) -> Rescore:
    """The float64 logits after `prefix` for `tokens` (and the exact row's best NOISE_TOKENS), plus the noise of one
    forward of the model as loaded (its dtype and kernels) at the same position."""
    exact_row = exact_logits(model, prefix)  # (V,) float64
    best = exact_row.topk(min(NOISE_TOKENS, exact_row.shape[0])).indices.tolist()
    ids = sorted(set(tokens) | set(best))
    return Rescore({i: float(exact_row[i]) for i in ids}, noise_sample(model, prefix, exact_row, best),
                   str(_dtype(model)).removeprefix("torch."))


@torch.inference_mode()
def noise_sample(model: nn.Module, prefix: list[int], exact_row: torch.Tensor, tokens: list[int]) -> float:
    """Max |logit - exact| over `tokens` of one forward over the whole prefix in the model's own dtype and kernels:
    another summation order than both the baseline's one-token steps and the run's verification forwards, so a
    sample of the rounding a correct forward makes at this very position."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([prefix], device=device), logits_to_keep=1).logits[0, -1]  # (V,)
    picked = torch.tensor(tokens, device=device)
    return float((logits[picked].double() - exact_row[picked].to(device)).abs().max())


@torch.inference_mode()
def exact_logits(model: nn.Module, prefix: list[int]) -> torch.Tensor:
    """The last position's logits (V,) in float64, one decoder layer at a time (see the module docstring)."""
    config = model.config
    device = next(model.parameters()).device
    ids = torch.tensor([prefix], device=device)  # (1, n)
    n = len(prefix)
    hidden = _embed64(model.get_input_embeddings(), ids)  # (1, n, d) float64
    positions = torch.arange(n, device=device)[None]  # (1, n)
    rotary = Rotary(model.get_decoder().rotary_emb)
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    for i, layer in enumerate(decoder_layers(model)):
        kind = types[i] if i < len(types) else "full_attention"
        cos_sin = _rotary64(rotary, hidden, positions, kind)
        mask = causal_mask(n, 0, torch.float64, device)  # (1, 1, n, n)
        if kind == "sliding_attention" and window:
            mask = _windowed(mask, window)
        shadow = float64_copy(layer)
        out = shadow(hidden_states=hidden, attention_mask=mask, position_ids=positions, past_key_values=None,
                     use_cache=False, position_embeddings=cos_sin)
        hidden = out[0] if isinstance(out, tuple) else out  # (1, n, d)
        del shadow
    last = float64_copy(model.get_decoder().norm)(hidden[0, -1])  # (d,)
    logits = _head64(model.get_output_embeddings(), last)  # (V,)
    cap = getattr(config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def float64_copy(module: nn.Module) -> nn.Module:
    """A float64 copy of `module` with every linear dense (packed and int8 weights read back); the original stays."""
    memo = {id(m): _dense_linear64(m) for m in module.modules() if isinstance(m, kernels.PackedLinear)
            or kernels.is_int8(m)}
    return copy.deepcopy(module, memo).to(torch.float64)


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """The (out, in) weight of an nn.Linear, a PackedLinear or an int8 dynamic linear, as a dense float tensor."""
    if isinstance(linear, kernels.PackedLinear):
        return linear.dense if linear.dense is not None else linear.packed.to_dense()
    if kernels.is_int8(linear):
        return kernels.int8_weight(linear)
    return linear.weight


def _dense_linear64(linear: nn.Module) -> nn.Linear:
    weight = dense_weight(linear).detach()
    bias = linear.bias() if callable(getattr(linear, "bias", None)) else linear.bias
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    out.weight = nn.Parameter(weight.to(torch.float64), requires_grad=False)
    out.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.float64), requires_grad=False)
    return out


def _embed64(embed: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Embedding rows in float64 (Gemma's scaled embedding: the scale applied in float64 too). (1, n, d)"""
    rows = embed.weight[ids].to(torch.float64)  # (1, n, d)
    scale = getattr(embed, "embed_scale", None)
    return rows * scale.to(torch.float64) if isinstance(scale, torch.Tensor) else rows


def _rotary64(rotary: Rotary, hidden: torch.Tensor, positions: torch.Tensor, kind: str):
    """cos/sin for one layer type, as the model computes them (float32 angles), held in float64."""
    if rotary._layer_type:
        cos, sin = rotary.module(hidden, positions, kind)
    else:
        cos, sin = rotary(hidden, positions)
    return cos.to(torch.float64), sin.to(torch.float64)  # (1, n, hd) each


def _windowed(mask: torch.Tensor, window: int) -> torch.Tensor:
    """A sliding-window layer: key j is visible from query i only when i - j < window. (1, 1, n, n)"""
    n = mask.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return mask.masked_fill((i - j >= window).to(mask.device)[None, None], torch.finfo(mask.dtype).min)


def _head64(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """hidden (d,) float64 through the LM head in float64, HEAD_CHUNK rows of the weight at a time -> (V,)."""
    weight = dense_weight(head)  # (V, d), the model's dtype
    bias = getattr(head, "bias", None)
    bias = bias() if callable(bias) else bias
    rows = [weight[start:start + HEAD_CHUNK].to(torch.float64) @ hidden for start in range(0, weight.shape[0],
                                                                                           HEAD_CHUNK)]
    logits = torch.cat(rows)  # (V,)
    return logits + bias.to(torch.float64) if bias is not None else logits


def _dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype
