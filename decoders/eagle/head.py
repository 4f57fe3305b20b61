"""The EAGLE-1/2 draft head (Li et al., ICML 2024): one decoder layer that extrapolates the target's features.

    u_i = fc([Emb(t_{i+1}) ; f_i])        2d -> d; embedding first, feature second (as SafeAILab/EAGLE's cnets1.py)
    g_i = DecoderLayer(u_<=i)              ONE layer of the target's own family, built by transformers' own class
    q_{i+2} = softmax(LMHead(g_i))         the target's LM head, frozen and shared (no final norm: g_i stands in
                                           for f_{i+1}, which is already the normed input of the LM head)

f_i is the target's top feature at position i: the output of the last decoder layer after the final norm, i.e. the
vector the target's LM head reads (EAGLE's ea_model.py takes `outputs[0]` of the base model). The embedding and LM
head are the target's modules, referenced, not copied: they never appear in `parameters()` or `state_dict()`, and
no gradient reaches them. As in EAGLE's layer 0 the decoder layer has no input norm (the fc output enters attention
directly).

Optional reduced draft vocabulary (EAGLE-3's d2t idea): the head scores only `vocab_ids` (N target ids, e.g. the
most frequent tokens of the training data), so its LM head is N x d instead of V x d; logits come back over those N
columns and `to_target_ids` maps a column back to a target token id.
"""
from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from ..runtime.runner import decoder_layers


class EagleHead(nn.Module):
    """fc + one decoder layer; `forward(ids, features, ...) -> (next features, logits)`."""

    arch = "eagle1"  # EAGLE-1/2's head (EAGLE-3's: head3.Eagle3Head)
    predicts_features = True  # g_i is trained to be f_{i+1} (the regression term)
    feature_layers = None  # which target hidden states it reads: None = the top feature (runner.pick_features)

    def __init__(self, target: nn.Module, bias: bool = True, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        self.config = head_config(target.config)
        d = self.config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=bias)
        layer = type(decoder_layers(target)[0])(self.config, layer_idx=0)  # the target family's own layer class
        layer.input_layernorm = nn.Identity()  # EAGLE's layer 0 has no input norm
        self.layers = nn.ModuleList([layer])  # "layers.0.*": the official key names
        self.rotary = type(target.get_decoder().rotary_emb)(config=self.config)  # no persistent state
        self._rotary_takes_layer_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        # The target, held in a tuple so nn.Module does not register (or save, or train) its modules; its embedding
        # and LM head are looked up on each call, so a kernel swap on the target (decoders/runtime/kernels.py) is followed.
        self._target = (target,)
        self.register_buffer("vocab_ids", None, persistent=False)  # (N,) or None; saved by official.py
        self.register_buffer("_reduced_weight", None, persistent=False)  # (N, d): gathered LM-head rows
        if vocab_ids is not None:
            self.set_draft_vocab(vocab_ids)
        weight = self._lm_head_weight()
        self.to(device=weight.device, dtype=weight.dtype)

    # ------------------------------------------------------------------ the forward

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache=None, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids (B, n): the token after each feature; features (B, n, d): target (or own) features.

        position_ids (B, n) default to cache length + 0..n-1. cache: a transformers DynamicCache the layer appends
        to (None: no cache). attention_mask: an additive float mask (B or 1, 1, n, past + n), e.g. a tree mask
        from decoders.tree.attention_mask_4d; None = causal over the cache and the new positions.
        Returns (next features (B, n, d), logits (B, n, V or N)).
        """
        hidden = self.features(input_ids, features, position_ids, cache, attention_mask)  # (B, n, d)
        return hidden, self.logits(hidden)  # (B, n, d), (B, n, V|N)

    def features(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                 cache=None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder part of `forward` alone (training scores logits in its own, cheaper way). (B, n, d)"""
        batch, n = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device).expand(batch, n)  # (B, n)
        if attention_mask is None:
            attention_mask = causal_mask(n, past, features.dtype, features.device)  # (1, 1, n, past + n)
        with torch.no_grad():  # the embedding is the target's, frozen
            embedded = self.embedding(input_ids).to(features.dtype)  # (B, n, d)
        hidden = self.fc(torch.cat([embedded, features], dim=-1))  # (B, n, 2d) -> (B, n, d)
        rotary_args = (self.config.layer_types[0],) if self._rotary_takes_layer_type else ()
        cos_sin = self.rotary(hidden, position_ids, *rotary_args)  # ((B, n, hd), (B, n, hd))
        out = self.layers[0](hidden_states=hidden, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=cache is not None, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out  # (B, n, d)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The frozen LM head over the draft vocabulary: (B, n, d) -> (B, n, V), or (B, n, N) when reduced."""
        if self.vocab_ids is not None:
            return nn.functional.linear(hidden, self._reduced_weight)  # (B, n, N)
        head = self.lm_head
        if isinstance(head, nn.Linear) or torch.is_grad_enabled():  # detach: gradients reach `hidden`, not the target
            bias = head.bias.detach() if head.bias is not None else None
            return nn.functional.linear(hidden, self._lm_head_weight().detach(), bias)  # (B, n, V)
        return head(hidden)  # (B, n, V): a packed kernel (decoders/runtime/kernels.py), inference only

    def lift(self, features: torch.Tensor) -> torch.Tensor:
        """Into the head's input space: target features and the head's own are both d wide here (the identity)."""
        return features

    def label_logits(self, final: torch.Tensor) -> torch.Tensor:
        """The target's logits over the draft vocabulary (training labels): its frozen rows. (…, d) -> (…, V|N)"""
        return self.logits(final)

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own full-vocabulary LM head (what the head is judged against). (..., d) -> (..., V)"""
        return nn.functional.linear(features, self._lm_head_weight().detach())  # (..., V)

    # ------------------------------------------------------------------ the reduced vocabulary

    def set_draft_vocab(self, vocab_ids: torch.Tensor | None) -> None:
        """Score only these target ids (None: the full vocabulary). The N x d weight is gathered once, here."""
        if vocab_ids is None:
            self.vocab_ids = None
            self._reduced_weight = None
            return
        ids = torch.as_tensor(vocab_ids, dtype=torch.long).flatten()  # (N,)
        vocab = self._lm_head_weight().shape[0]
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != ids.numel():
            raise ValueError(f"draft vocabulary must be distinct target ids in [0, {vocab}); got {ids.numel()} ids")
        weight = self._lm_head_weight()
        self.vocab_ids = ids.to(weight.device)
        self._reduced_weight = weight.detach()[self.vocab_ids].clone()  # (N, d): a copy of N rows, frozen

    def to_target_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Logit columns -> target token ids (the identity for the full vocabulary)."""
        return columns if self.vocab_ids is None else self.vocab_ids[columns]

    @property
    def embedding(self) -> nn.Module:
        return self._target[0].get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self._target[0].get_output_embeddings()

    def _lm_head_weight(self) -> torch.Tensor:
        return lm_head_weight(self._target[0])

    @property
    def vocab_size(self) -> int:
        return int(self.vocab_ids.numel()) if self.vocab_ids is not None else self.config.vocab_size


def lm_head_weight(target: nn.Module) -> torch.Tensor:
    """(V, d). A packed LM head (decoders/runtime/kernels.py) keeps its dense weight only when tied; else unpack it."""
    head = target.get_output_embeddings()
    if isinstance(head, nn.Linear):
        return head.weight
    return head.dense if getattr(head, "dense", None) is not None else head.packed.to_dense()


def head_config(target_config):
    """The target's config cut to one decoder layer (the official config.json of a head is this, plus "bias")."""
    config = copy.deepcopy(getattr(target_config, "text_config", None) or target_config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"]  # one layer, always full attention (EAGLE's layer is)
    config.use_cache = True
    return config


def causal_mask(n: int, past: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """Additive mask (1, 1, n, past + n): every new position sees the cache and the new positions up to itself."""
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)  # (n, past + n)
    mask = torch.zeros(n, past + n, dtype=dtype, device=device)  # (n, past + n)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]  # (1, 1, n, past + n)
