"""Layer-skip self-speculation (Draft & Verify style): the target with some decoder layers skipped is the draft.

No extra weights. The draft shares the target's KV cache for the context: skipped layers write nothing, kept layers
append entries for the drafted tokens, and those are dropped again before the target verifies. Untrained, it
accepts little on small models (see docs): it is here to teach that a draft must be both cheap and aligned.
"""
from __future__ import annotations

from ..runtime.runner import CachedModel, decoder_layers, skipping_layers
from .base import Drafter, Proposal, draft_chain


def default_skip_layers(n_layers: int, layer_types: list[str] | None = None) -> list[int]:
    """Every odd layer in the middle of the stack (for 30 layers: 9, 11, ..., 23, as measured in the notes).

    In a model that mixes sliding and full attention (Gemma 3), the full-attention layers are the only ones that
    see past the window: they are kept, so the draft stays a long-context model and every mask has its source.
    """
    types = layer_types or ["full_attention"] * n_layers
    mixed = "sliding_attention" in types
    return [i for i in range(int(0.3 * n_layers), int(0.8 * n_layers))
            if i % 2 == 1 and not (mixed and types[i] == "full_attention")]


def mask_source_layers(layer_types: list[str]) -> dict[int, str]:
    """Layers that must run: transformers sizes each layer type's mask from the first cached layer of that type
    (the first full-attention layer, the first sliding one); layer 0 also gives the cache length."""
    sources = {0: "layer 0 gives the cache length"}
    for kind in ("full_attention", "sliding_attention"):
        if kind in layer_types:
            first = layer_types.index(kind)
            sources.setdefault(first, f"transformers sizes the {kind.replace('_', '-')} mask from layer {first}, "
                                      f"the first {kind.split('_')[0]}-attention layer")
    return sources


class LayerSkipDrafter(Drafter):
    name = "layer-skip"

    def __init__(self, target: CachedModel, skip: list[int] | None = None):
        n_layers = len(decoder_layers(target.model))
        types = list(getattr(target.model.config, "layer_types", None) or ["full_attention"] * n_layers)
        self.skip = set(default_skip_layers(n_layers, types) if skip is None else skip)
        outside = sorted(i for i in self.skip if not 0 <= i < n_layers)
        if outside:
            raise ValueError(f"cannot skip layer(s) {outside}: the model has layers 0..{n_layers - 1}")
        needed = mask_source_layers(types)
        blocked = sorted(self.skip & needed.keys())
        if blocked:
            raise ValueError(f"cannot skip layer {blocked[0]}: {needed[blocked[0]]}; drop {blocked[0]} from the skip set")
        self.kept = [i for i in range(n_layers) if i not in self.skip]
        self.target = target

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        start = self.target.length  # the context; everything the draft appends beyond it is thrown away
        try:
            with skipping_layers(self.target.model, self.skip), self.target.eager():  # no graph holds these layers
                proposal = draft_chain(lambda tokens: self.target.forward(tokens, last_only=True)[-1], [ids[-1]],
                                       limit, rule, warp, generator, record, tensors=True)  # drafts on the device
        finally:
            self.target.drop_last(self.target.length - start, layers=self.kept)
        return proposal
