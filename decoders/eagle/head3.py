"""The EAGLE-3 draft head (Li et al., 2025), in SafeAILab/EAGLE's layout (eagle/model/cnets.py, use_eagle3=True).

    u_i = fc([h_low ; h_mid ; h_high]_i)          3d -> d, no bias: the target's hidden states from three layers
    x_i = [input_layernorm(Emb(t_{i+1})) ; hidden_norm(u_i)]          2d: embedding first, as SafeAILab's midlayer
    a_i = u_i + Attn(x_i)                         q/k/v read 2d, o writes d; the residual is u_i, not x_i
    g_i = a_i + MLP(post_attention_layernorm(a_i))
    q_{i+2} = softmax(lm_head(norm(g_i)))         the head's OWN norm and LM head over the draft vocabulary (N)

The fused features replace EAGLE-1's top feature: h_k is the target's hidden state entering decoder layer k
(transformers' hidden_states[k]) for k = 2, L // 2, L - 3, as SafeAILab's modeling_llama_kv.py collects them.
Inside a draft the head reads its own g (d wide) where the target's fused feature (3d) would be, with no fc, as
SafeAILab's Model.forward does (fc only when the width is not d): `lift` is that rule. g is not trained to be a
target feature (EAGLE-3 drops the regression loss); it is only the next draft step's input.

The draft vocabulary is stored as SafeAILab does: d2t (N,) with target id = draft id + d2t[draft id], and t2d (V,)
bool marking the target ids drafted. The embedding is the target's (shared, frozen, never saved: SafeAILab loads it
from the base model too); the head's norm and LM head start as copies of the target's (rows of the draft vocabulary),
so an untrained head drafts from a sensible output space.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

from ..runtime.runner import decoder_layers
from .head import causal_mask, head_config, lm_head_weight

_NEEDED = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")  # a Llama-style layer (Llama, Qwen2)
_UNPLACED = ("pre_feedforward_layernorm", "post_feedforward_layernorm")  # Gemma's extra norms: SafeAILab's has none


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """SafeAILab's low/mid/high choice: the hidden states entering layers 2, L // 2 and L - 3 (clamped for tiny
    test models), ascending, the order their layer loop collects them in."""
    return tuple(sorted(min(max(k, 0), num_layers) for k in (2, num_layers // 2, num_layers - 3)))


class Eagle3Head(nn.Module):
    """fc (3d -> d) + one fused-input decoder layer + own norm and LM head; `forward(ids, features, ...)`."""

    arch = "eagle3"
    predicts_features = False  # EAGLE-3 trains no feature regression: g feeds the next step, nothing else

    def __init__(self, target: nn.Module, vocab_ids: torch.Tensor | None = None,
                 feature_layers: tuple[int, ...] | None = None):
        super().__init__()
        self.config = head_config(target.config)
        d = self.config.hidden_size
        n_layers = (getattr(target.config, "text_config", None) or target.config).num_hidden_layers
        self.feature_layers = tuple(int(k) for k in (feature_layers or default_feature_layers(n_layers)))
        if len(self.feature_layers) != 3 or not all(0 <= k <= n_layers for k in self.feature_layers):
            raise ValueError(f"an EAGLE-3 head fuses 3 of the target's hidden states (0..{n_layers}); "
                             f"got {self.feature_layers}")
        self._target = (target,)  # not registered: the target's modules are never saved or trained here
        self.fc = nn.Linear(3 * d, d, bias=False)
        self.midlayer = _fused_layer(target, self.config)
        self.rotary = type(target.get_decoder().rotary_emb)(config=self.config)
        self._rotary_takes_layer_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        final_norm = target.get_decoder().norm
        self.norm = type(final_norm)(d, eps=self.config.rms_norm_eps)
        ids = _draft_ids(vocab_ids, self.config.vocab_size)  # (N,)
        self.lm_head = nn.Linear(d, len(ids), bias=False)
        self.register_buffer("d2t", ids - torch.arange(len(ids)))  # (N,): SafeAILab's offsets
        t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        self.register_buffer("t2d", t2d)  # (V,)
        weight = lm_head_weight(target)
        with torch.no_grad():  # start from the target's own output space
            self.norm.weight.copy_(final_norm.weight)
            self.lm_head.weight.copy_(weight.detach()[ids.to(weight.device)])
        self.to(device=weight.device, dtype=weight.dtype)

    # ------------------------------------------------------------------ the forward

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache=None, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids (B, n); features (B, n, 3d) fused target features or (B, n, d) the head's own g.
        Returns (g (B, n, d), logits (B, n, N)). Masks and positions as EagleHead.forward."""
        hidden = self.features(input_ids, features, position_ids, cache, attention_mask)  # (B, n, d)
        return hidden, self.logits(hidden)  # (B, n, d), (B, n, N)

    def features(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                 cache=None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder part alone. (B, n, d)"""
        batch, n = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device).expand(batch, n)  # (B, n)
        if attention_mask is None:
            attention_mask = causal_mask(n, past, features.dtype, features.device)  # (1, 1, n, past + n)
        hidden = self.lift(features)  # (B, n, d)
        with torch.no_grad():  # the embedding is the target's, frozen
            embedded = self.embedding(input_ids).to(hidden.dtype)  # (B, n, d)
        layer = self.midlayer
        fused = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)  # (B, n, 2d)
        rotary_args = (self.config.layer_types[0],) if self._rotary_takes_layer_type else ()
        cos_sin = self.rotary(hidden, position_ids, *rotary_args)  # ((B, n, hd), (B, n, hd))
        attended, _ = layer.self_attn(hidden_states=fused, position_embeddings=cos_sin, attention_mask=attention_mask,
                                      past_key_values=cache, position_ids=position_ids)  # (B, n, d)
        hidden = hidden + attended  # the residual is the fc output (SafeAILab: residual = hidden_states)
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))  # (B, n, d)

    def lift(self, features: torch.Tensor) -> torch.Tensor:
        """Into the head's width: fused target features (…, 3d) through fc; the head's own g (…, d) as they are."""
        return self.fc(features) if features.shape[-1] != self.config.hidden_size else features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's own LM head over the draft vocabulary. (B, n, d) -> (B, n, N)"""
        return self.lm_head(self.norm(hidden))

    def label_logits(self, final: torch.Tensor) -> torch.Tensor:
        """The target's logits over the draft vocabulary from its top feature (training labels). (…, d) -> (…, N)"""
        weight = lm_head_weight(self._target[0]).detach()
        return nn.functional.linear(final, weight[self.draft_ids])  # (…, N)

    def target_logits(self, final: torch.Tensor) -> torch.Tensor:
        """The target's own full-vocabulary LM head. (…, d) -> (…, V)"""
        return nn.functional.linear(final, lm_head_weight(self._target[0]).detach())

    # ------------------------------------------------------------------ the draft vocabulary

    @property
    def draft_ids(self) -> torch.Tensor:
        """(N,) the target id of each logit column."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """As EagleHead.vocab_ids: None when the head drafts the whole vocabulary (no scatter needed)."""
        return None if len(self.d2t) == self.config.vocab_size else self.draft_ids

    def to_target_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns + self.d2t[columns]

    @property
    def vocab_size(self) -> int:
        return len(self.d2t)

    @property
    def embedding(self) -> nn.Module:
        return self._target[0].get_input_embeddings()


def _draft_ids(vocab_ids: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """Distinct ascending target ids (N,); None: the whole vocabulary."""
    if vocab_ids is None:
        return torch.arange(vocab)
    ids = torch.as_tensor(vocab_ids, dtype=torch.long).flatten().cpu()  # (N,)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != ids.numel():
        raise ValueError(f"draft vocabulary must be distinct target ids in [0, {vocab}); got {ids.numel()} ids")
    return ids.sort().values


def _fused_layer(target: nn.Module, config) -> nn.Module:
    """The target family's own decoder layer, widened as SafeAILab's LlamaDecoderLayeremb: q/k/v read 2d, and a
    hidden_norm for the fc output next to the input_layernorm (which now norms the embedding)."""
    layer = type(decoder_layers(target)[0])(config, layer_idx=0)
    missing = [name for name in _NEEDED if not hasattr(layer, name)]
    extra = [name for name in _UNPLACED if hasattr(layer, name)]
    if missing or extra:
        raise ValueError(f"EAGLE-3 heads are built for Llama-style layers (Llama, Qwen2); {type(layer).__name__} "
                         + (f"has no {', '.join(missing)}" if missing else f"has {', '.join(extra)}"))
    d = config.hidden_size
    attention = layer.self_attn
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attention, name)
        setattr(attention, name, nn.Linear(2 * d, old.out_features, bias=old.bias is not None))
    layer.hidden_norm = type(layer.input_layernorm)(d, eps=config.rms_norm_eps)
    return layer
