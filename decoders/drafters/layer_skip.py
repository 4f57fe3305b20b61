"""Layer-skip self-speculation (Draft & Verify style): the target with some decoder layers skipped is the draft.

No extra weights. The draft shares the target's KV cache for the context: skipped layers write nothing, kept layers
append entries for the drafted tokens, and those are dropped again before the target verifies. Untrained, it
accepts little on small models (see docs): it is here to teach that a draft must be both cheap and aligned.
"""
from __future__ import annotations

from ..runner import CachedModel, decoder_layers, skipping_layers
from .base import Drafter, Proposal, draft_chain


def default_skip_layers(n_layers: int) -> list[int]:
    """Every odd layer in the middle of the stack (for 30 layers: 9, 11, ..., 23, as measured in the notes)."""
    return [i for i in range(int(0.3 * n_layers), int(0.8 * n_layers)) if i % 2 == 1]


class LayerSkipDrafter(Drafter):
    name = "layer-skip"

    def __init__(self, target: CachedModel, skip: list[int] | None = None):
        n_layers = len(decoder_layers(target.model))
        self.skip = set(default_skip_layers(n_layers) if skip is None else skip)
        bad = sorted(i for i in self.skip if not 0 < i < n_layers)
        if bad:
            raise ValueError(f"cannot skip layer(s) {bad}: the model has layers 0..{n_layers - 1} and layer 0 must run")
        self.kept = [i for i in range(n_layers) if i not in self.skip]
        self.target = target

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        start = self.target.length  # the context; everything the draft appends beyond it is thrown away
        try:
            with skipping_layers(self.target.model, self.skip):
                proposal = draft_chain(lambda tokens: self.target.forward(tokens, last_only=True)[-1], [ids[-1]],
                                       limit, rule, warp, generator, record)
        finally:
            self.target.drop_last(self.target.length - start, layers=self.kept)
        return proposal
