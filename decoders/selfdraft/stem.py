"""Run a slice of a decoder's layers by hand: what lets a draft stop after layer k, and verification resume there.

transformers' model.forward always runs every layer from the embedding; an early-exit draft needs layers 0..k-1
alone (writing their cache slots), and its verification needs layers k..L-1 alone, over hidden states the draft
already computed. Both are `run_layers` with explicit positions and a 4-D additive mask: the layers' cache slots
are independent, so layers 0..k-1 may hold more entries than k..L-1 between draft and verification.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

from ..runtime.runner import decoder_layers


def check_full_attention(config) -> None:
    """Sliding-window layers need per-layer masks this runner does not build: say so instead of decoding wrongly."""
    types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        raise ValueError("early-exit and prophet drafters support full-attention targets only (this model mixes "
                         "sliding-window layers); pick layer-skip or eagle-tree for it")


def causal_mask(n: int, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask (1, 1, n, past + n): each new position sees the past and the new positions up to itself."""
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)  # (n, past + n)
    mask = torch.zeros(n, past + n, dtype=dtype, device=device)  # (n, past + n)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]  # (1, 1, n, past + n)


def step_mask(n: int, past: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """causal_mask, or None for one new position (it sees every cached key; SDPA then needs no mask tensor)."""
    return None if n == 1 else causal_mask(n, past, dtype, device)


def padded_causal_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Causal mask for a right-padded batch without cache: keep (B, n) bool. -> (B, 1, n, n)"""
    n = keep.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool, device=keep.device).tril()[None] & keep[:, None, :]  # (B, n, n)
    allowed |= torch.eye(n, dtype=torch.bool, device=keep.device)[None]  # padded rows see themselves: no NaN
    mask = torch.zeros(allowed.shape, dtype=dtype, device=keep.device)  # (B, n, n)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]  # (B, 1, n, n)


class Rotary:
    """The target family's rotary embedding, called the way this transformers version wants."""

    def __init__(self, module: nn.Module):
        self.module = module
        self._layer_type = "layer_type" in inspect.signature(module.forward).parameters

    def __call__(self, hidden: torch.Tensor, positions: torch.Tensor):
        args = ("full_attention",) if self._layer_type else ()
        return self.module(hidden, positions, *args)  # ((B, n, hd), (B, n, hd))


def run_layers(layers, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rotary: Rotary,
               cache=None) -> torch.Tensor:
    """hidden (B, n, d) through `layers` in order; each appends its keys/values to its own slot of `cache`."""
    cos_sin = rotary(hidden, positions)
    for layer in layers:
        out = layer(hidden_states=hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=cache is not None, position_embeddings=cos_sin)
        hidden = out[0] if isinstance(out, tuple) else out  # (B, n, d)
    return hidden


def target_rotary(target: nn.Module) -> Rotary:
    return Rotary(target.get_decoder().rotary_emb)


def stem_layers(target: nn.Module, k: int) -> list[nn.Module]:
    return list(decoder_layers(target))[:k]


def upper_layers(target: nn.Module, k: int) -> list[nn.Module]:
    return list(decoder_layers(target))[k:]


class DraftVocab(nn.Module):
    """The target's LM head, optionally cut to N frequent ids (EAGLE-3's reduced vocabulary): never trained, never
    saved (only vocab_ids are). logits: (..., d) -> (..., N or V); to_target_ids maps a column to a token id."""

    def __init__(self, target: nn.Module, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        self._target = (target,)  # a tuple: not registered, so never trained or saved
        self.register_buffer("vocab_ids", None, persistent=False)
        self.register_buffer("_weight", None, persistent=False)
        self.set(vocab_ids)

    def full_weight(self) -> torch.Tensor:
        head = self._target[0].get_output_embeddings()
        if isinstance(head, nn.Linear):
            return head.weight
        return head.dense if getattr(head, "dense", None) is not None else head.packed.to_dense()  # kernels.py

    def set(self, vocab_ids: torch.Tensor | None) -> None:
        weight = self.full_weight().detach()  # (V, d)
        if vocab_ids is None:
            self.vocab_ids, self._weight = None, weight
            return
        ids = torch.as_tensor(vocab_ids, dtype=torch.long).flatten().to(weight.device)  # (N,)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0] or ids.unique().numel() != ids.numel():
            raise ValueError(f"draft vocabulary must be distinct target ids in [0, {weight.shape[0]})")
        self.vocab_ids, self._weight = ids, weight[ids].clone()  # (N,), (N, d)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self._weight.to(hidden.dtype))  # (..., N|V)

    def to_target_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.vocab_ids is None else self.vocab_ids[columns]

    def full_distribution(self, q: torch.Tensor, vocab: int) -> torch.Tensor:
        """q over the draft columns (N,) -> over the target's vocabulary (V,), zero outside the draft vocabulary."""
        if self.vocab_ids is None:
            return q
        out = torch.zeros(vocab, dtype=q.dtype, device=q.device)  # (V,)
        out[self.vocab_ids] = q
        return out

    @property
    def size(self) -> int:
        return int(self._weight.shape[0])
