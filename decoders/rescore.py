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

It also times nothing and needs no cache: one forward over the prefix, no KV kept.

Why the referee never runs the model's own kernels: a bug in them (a fused stand-in, a packed or int8 kernel) is in
every forward of the model as loaded -- the baseline's, the run's -- and a referee that ran them would share it.
So the forward here is the stock computation on the stock weights: packed and int8 linears read back dense, fused
stand-ins (decoders/fused.py) replaced by the stock modules they stand for, and every RMSNorm computed by
`ReferenceRMSNorm`, in float64 when the forward is float64 (the stock norm casts to float32 whatever it is given,
which would hold the float64 referee to float32 precision at every layer).

The noise -- what a correct forward in the run's own dtype gets wrong at this position, the scale compare.py judges
a run's error on -- is measured the same way, the same stock computation in the run's dtype: so a shared bug cannot
set its own tolerance. (It used to be a forward of the model as loaded: a kernel off by 1e-3 made a noise of 1e-3
and was then "rounding".)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from .runtime import fused, kernels
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
    """The float64 logits after `prefix` for `tokens` (and the exact row's best NOISE_TOKENS), plus the noise of a
    correct forward in the model's dtype at the same position (the stock computation, not the model's kernels)."""
    exact_row = exact_logits(model, prefix)  # (V,) float64
    best = exact_row.topk(min(NOISE_TOKENS, exact_row.shape[0])).indices.tolist()
    ids = sorted(set(tokens) | set(best))
    return Rescore({i: float(exact_row[i]) for i in ids}, noise_sample(model, prefix, exact_row, best),
                   str(_dtype(model)).removeprefix("torch."))


def noise_sample(model: nn.Module, prefix: list[int], exact_row: torch.Tensor, tokens: list[int]) -> float:
    """Max |logit - exact| over `tokens` of the stock forward over the whole prefix in the model's own dtype, a layer
    at a time: another summation order than both the baseline's one-token steps and the run's verification
    forwards, so a sample of the rounding a correct forward makes at this very position."""
    logits = reference_logits(model, prefix, _dtype(model))  # (V,)
    picked = torch.tensor(tokens, device=logits.device)
    return float((logits[picked].double() - exact_row[picked].to(logits.device)).abs().max())


def exact_logits(model: nn.Module, prefix: list[int]) -> torch.Tensor:
    """The last position's logits (V,) in float64, one decoder layer at a time (see the module docstring)."""
    return reference_logits(model, prefix, torch.float64)


@torch.inference_mode()
def reference_logits(model: nn.Module, prefix: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The last position's logits (V,) of the stock computation in `dtype` on the model's weights, one decoder
    layer at a time, each copied to `dtype` and dropped after use (the model itself is never touched)."""
    config = model.config
    device = next(model.parameters()).device
    ids = torch.tensor([prefix], device=device)  # (1, n)
    n = len(prefix)
    hidden = _embed(model.get_input_embeddings(), ids, dtype)  # (1, n, d)
    positions = torch.arange(n, device=device)[None]  # (1, n)
    rotary = Rotary(model.get_decoder().rotary_emb)
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    for i, layer in enumerate(decoder_layers(model)):
        kind = types[i] if i < len(types) else "full_attention"
        cos_sin = _rotary(rotary, hidden, positions, kind, dtype)
        mask = causal_mask(n, 0, dtype, device)  # (1, 1, n, n)
        if kind == "sliding_attention" and window:
            mask = _windowed(mask, window)
        shadow = reference_copy(layer, dtype)
        out = shadow(hidden_states=hidden, attention_mask=mask, position_ids=positions, past_key_values=None,
                     use_cache=False, position_embeddings=cos_sin)
        hidden = out[0] if isinstance(out, tuple) else out  # (1, n, d)
        del shadow
    last = reference_copy(model.get_decoder().norm, dtype)(hidden[0, -1])  # (d,)
    logits = _head(model.get_output_embeddings(), last, dtype)  # (V,)
    cap = getattr(config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def reference_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of `module` in `dtype` that computes what the stock module computes on its weights: every linear dense
    (packed and int8 weights read back), fused stand-ins replaced by the stock modules they stand for, every RMSNorm
    a ReferenceRMSNorm (in float64 when `dtype` is). The original stays as it is."""
    memo = {id(m): _dense_linear(m, dtype) for m in module.modules() if isinstance(m, kernels.PackedLinear)
            or kernels.is_int8(m)}
    return _stock(copy.deepcopy(module, memo)).to(dtype)


class ReferenceRMSNorm(nn.Module):
    """RMSNorm as transformers computes it -- in float32 for float32 and narrower inputs, with Llama/Qwen's rounding
    of x-normed to the input dtype before the weight, Gemma's (1 + w) after -- except that a float64 input is
    computed in float64 throughout (the stock norms cast it down to float32)."""

    def __init__(self, weight: nn.Parameter, eps: float, plus_one: bool):
        super().__init__()
        self.weight, self.eps, self.plus_one = weight, eps, plus_one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        h = x.to(compute)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., d)
        if self.plus_one:
            return (h * (1.0 + self.weight.to(compute))).to(x.dtype)
        return self.weight * h.to(x.dtype)


def _stock(module: nn.Module) -> nn.Module:
    """`module` (a copy) with its fused stand-ins replaced by their stock modules and its RMSNorms by reference ones."""
    if isinstance(module, fused.Fused):
        module = module.stock
    name = type(module).__name__
    if name.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor):
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
        return ReferenceRMSNorm(module.weight, float(eps), plus_one=name.startswith("Gemma"))
    for child_name, child in list(module.named_children()):
        setattr(module, child_name, _stock(child))
    return module


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """The (out, in) weight of an nn.Linear, a PackedLinear or an int8 dynamic linear, as a dense float tensor."""
    if isinstance(linear, kernels.PackedLinear):
        return linear.dense if linear.dense is not None else linear.packed.to_dense()
    if kernels.is_int8(linear):
        return kernels.int8_weight(linear)
    return linear.weight


def _dense_linear(linear: nn.Module, dtype: torch.dtype) -> nn.Linear:
    weight = dense_weight(linear).detach()
    bias = linear.bias() if callable(getattr(linear, "bias", None)) else linear.bias
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    out.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
    out.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
    return out


def _embed(embed: nn.Module, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Embedding rows in `dtype` (Gemma's scaled embedding: the scale applied in `dtype` too). (1, n, d)"""
    rows = embed.weight[ids].to(dtype)  # (1, n, d)
    scale = getattr(embed, "embed_scale", None)
    return rows * scale.to(dtype) if isinstance(scale, torch.Tensor) else rows


def _rotary(rotary: Rotary, hidden: torch.Tensor, positions: torch.Tensor, kind: str, dtype: torch.dtype):
    """cos/sin for one layer type, as the model computes them (float32 angles), held in `dtype`."""
    if rotary._layer_type:
        cos, sin = rotary.module(hidden, positions, kind)
    else:
        cos, sin = rotary(hidden, positions)
    return cos.to(dtype), sin.to(dtype)  # (1, n, hd) each


def _windowed(mask: torch.Tensor, window: int) -> torch.Tensor:
    """A sliding-window layer: key j is visible from query i only when i - j < window. (1, 1, n, n)"""
    n = mask.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return mask.masked_fill((i - j >= window).to(mask.device)[None, None], torch.finfo(mask.dtype).min)


def _head(head: nn.Module, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """hidden (d,) through the LM head in `dtype`, HEAD_CHUNK rows of the weight at a time -> (V,)."""
    weight = dense_weight(head)  # (V, d), the model's dtype
    bias = getattr(head, "bias", None)
    bias = bias() if callable(bias) else bias
    rows = [weight[start:start + HEAD_CHUNK].to(dtype) @ hidden for start in range(0, weight.shape[0], HEAD_CHUNK)]
    logits = torch.cat(rows)  # (V,)
    return logits + bias.to(dtype) if bias is not None else logits


def _dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype
