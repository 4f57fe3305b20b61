"""The two trained modules. Both reuse the target family's own decoder-layer class, final norm and LM head.

ExitBlock (early exit): h_k, the hidden state after the target's first k layers -> one decoder layer (its own,
initialised from a copy of target layer k) -> a copy of the target's final norm -> the target's LM head.

Prophet: [W [f_t ; E(x_{t+1})], E(d_2), E(d_3), ...] -> n_layers decoder layers -> a copy of the final norm -> the
target's LM head. f_t is the target's last hidden state (after its final norm) at the last accepted position,
x_{t+1} the token the target just chose; output i predicts draft i+1 (token t+2+i). It has no other context: its
own cache lives for one round.

Initialisation (train.lens_init): the layers start as identities (zeroed output projections) and the linear input
map (ExitBlock.adapter, Prophet.proj) is the least-squares fit to the target's next feature (a "tuned lens"), with
the norm's weight set to the features' RMS: before any gradient step the draft is the best linear read-out.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..runtime import kernels
from ..runtime.runner import decoder_layers
from .stem import DraftVocab, Rotary, check_full_attention


def _small_config(target_config, n_layers: int):
    config = copy.deepcopy(getattr(target_config, "text_config", None) or target_config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"] * n_layers
    config.use_cache = True
    return config


def _copied_layers(target: nn.Module, config, sources: list[int]) -> nn.ModuleList:
    """Fresh layers of the target's class (own layer_idx 0..n-1 for their own cache) with copied weights."""
    layers = decoder_layers(target)
    out = nn.ModuleList()
    for i, source in enumerate(sources):
        layer = type(layers[source])(config, layer_idx=i)
        stock = copy.deepcopy(layers[source])
        kernels.unpack(stock)  # a target on packed matmuls (decoders/runtime/kernels.py): back to nn.Linear weights
        layer.load_state_dict(stock.state_dict())
        out.append(layer)
    return out


class _Drafting(nn.Module):
    """What both modules share: the family's rotary, a trainable copy of the final norm, the (reduced) LM head."""

    kind = ""

    def _finish_init(self, target: nn.Module, vocab_ids):
        self.rotary = Rotary(type(target.get_decoder().rotary_emb)(config=self.config))
        self.norm = copy.deepcopy(target.get_decoder().norm)
        self.vocab = DraftVocab(target, vocab_ids)
        self._target = (target,)
        weight = self.vocab.full_weight()
        self.to(device=weight.device, dtype=weight.dtype)
        self.norm.requires_grad_(True)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.vocab(self.norm(hidden))  # (..., N|V)

    @property
    def target(self) -> nn.Module:
        return self._target[0]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What is saved: every own parameter (the target's modules are referenced, never stored)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("vocab.")}


class ExitBlock(_Drafting):
    kind = "early-exit"

    def __init__(self, target: nn.Module, exit_layer: int, vocab_ids: torch.Tensor | None = None,
                 init_layer: int | None = None):
        super().__init__()
        check_full_attention(target.config)
        n = len(decoder_layers(target))
        if not 1 <= exit_layer < n:
            raise ValueError(f"exit layer must be in 1..{n - 1} for this {n}-layer target; got {exit_layer}")
        self.exit_layer = exit_layer
        self.config = _small_config(target.config, 1)
        source = exit_layer if init_layer is None else init_layer
        self.adapter = nn.Linear(self.config.hidden_size, self.config.hidden_size, bias=True)  # fit by train.lens_init
        nn.init.eye_(self.adapter.weight)
        nn.init.zeros_(self.adapter.bias)
        self.layers = _copied_layers(target, self.config, [source])
        self._finish_init(target, vocab_ids)

    def forward(self, hidden_k: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache=None) -> torch.Tensor:
        """h_k (B, n, d) -> logits (B, n, N|V); cache: the block's own one-layer DynamicCache (None in training)."""
        from .stem import run_layers

        hidden = self.adapter(hidden_k)  # (B, n, d)
        return self.logits(run_layers(self.layers, hidden, positions, mask, self.rotary, cache))  # (B, n, N|V)

    def meta(self) -> dict:
        return {"kind": self.kind, "exit_layer": self.exit_layer, "n_layers": 1}


class Prophet(_Drafting):
    kind = "prophet"

    def __init__(self, target: nn.Module, n_layers: int = 1, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        check_full_attention(target.config)
        total = len(decoder_layers(target))
        if not 1 <= n_layers <= total:
            raise ValueError(f"prophet layers must be in 1..{total}; got {n_layers}")
        self.config = _small_config(target.config, n_layers)
        d = self.config.hidden_size
        self.proj = nn.Linear(2 * d, d, bias=True)  # [f_t ; E(x_{t+1})] -> d; fit by train.lens_init
        with torch.no_grad():
            self.proj.weight.zero_()
            self.proj.weight[:, :d] = torch.eye(d)  # before fitting: the feature itself
            self.proj.bias.zero_()
        self.layers = _copied_layers(target, self.config, list(range(total - n_layers, total)))
        self._finish_init(target, vocab_ids)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # the target's embedding, frozen
            return self.target.get_input_embeddings()(ids).to(self.norm.weight.dtype)  # (..., d)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache=None) -> torch.Tensor:
        """inputs (B, n, d): [W[f_t; E(x_{t+1})], E(d_2), ...] (see first_input / embed). -> logits (B, n, N|V);
        output i predicts draft i+1."""
        from .stem import run_layers

        return self.logits(run_layers(self.layers, inputs, positions, mask, self.rotary, cache))

    def first_input(self, feature: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
        """feature (..., d): f_t; pending (...,) the token x_{t+1} the target chose. -> (..., d)"""
        return self.proj(torch.cat([feature.to(self.norm.weight.dtype), self.embed(pending)], dim=-1))

    def meta(self) -> dict:
        return {"kind": self.kind, "n_layers": len(self.layers)}
