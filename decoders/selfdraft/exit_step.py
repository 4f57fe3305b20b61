"""Early exit's draft step at one fixed shape (issue 46): layers 0..k-1 and the exit block over one token.

With a fixed KV plan the target's cache is a buffer (decoders/runtime/buffers.py) and the block's own cache is one
too, so a chain's draft step after the round's first (one token, a device tensor the chain never read) can run at
one shape: the stem writes its keys at the lower layers' next slot and attends over the whole target buffer
up to it, the block likewise over its own buffer, and the slots come from two () device tensors the host fills from
the lengths it keeps (a fill launches, nothing is copied or read). Replayed as one captured graph with graphs on
(decoders/runtime/steps.StepGraph), eagerly otherwise. The round's first step (the pending token plus the rows the
block has not read yet, a width that varies) runs as before.
"""
from __future__ import annotations

import torch

from ..runtime.buffers import BufferCache, BufferFull
from ..runtime.steps import StepGraph, one_row_mask
from .stem import run_layers


class FixedExitStep:
    """One draft step at one shape: token (1,) -> (logits over the block's vocabulary (N|V,), h_k (d,))."""

    def __init__(self, drafter, graphs: bool):
        self.drafter = drafter  # the EarlyExitDrafter: its target runner, stem, rotary, block and block cache
        device = drafter.target.device
        self.stem_at = torch.zeros((), dtype=torch.long, device=device)  # () the lower layers' next slot
        self.block_at = torch.zeros((), dtype=torch.long, device=device)  # () the block's next slot
        self.step = StepGraph(self._step, graphs)

    def usable(self) -> bool:
        """Both caches are buffers: a fixed plan's target and the block's own (EarlyExitDrafter.use_kv)."""
        d = self.drafter
        return isinstance(d.target.cache, BufferCache) and isinstance(d.block_cache, BufferCache)

    @torch.inference_mode()  # the buffers were made under inference mode: writes into them must be too
    def __call__(self, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.drafter
        lower, block = d.target.cache.layers[0], d.block_cache.layers[0]
        if lower.length + 1 > lower.capacity or block.length + 1 > block.capacity:
            raise BufferFull(f"an early-exit draft step after {lower.length} (stem) / {block.length} (block) entries "
                             f"would pass the buffers' {lower.capacity} / {block.capacity} slots")
        self.stem_at.fill_(lower.length)
        self.block_at.fill_(block.length)
        logits, h = self.step(token, self.stem_at, self.block_at)
        for layer in d.target.cache.layers[:d.k]:  # the fixed writes count nothing: the host keeps the lengths
            layer.length += 1
        block.length += 1
        return logits, h

    def _step(self, token: torch.Tensor, stem_at: torch.Tensor, block_at: torch.Tensor):
        """Tensor ops only (what a graph captures). -> ((N|V,) logits, (d,) h_k)"""
        d = self.drafter
        target, cache = d.target.model, d.target.cache
        hidden = target.get_input_embeddings()(token[None])  # (1, 1, d)
        columns = torch.arange(cache.capacity, device=token.device)  # (S,)
        mask = one_row_mask(stem_at, columns, hidden.dtype)  # (1, 1, 1, S)
        with cache.fixed_write(stem_at.view(1), 0):  # only the stem's layers run, so only they write
            h = run_layers(d.stem, hidden, stem_at.view(1, 1), mask, d.rotary, cache)  # (1, 1, d)
        own = d.block_cache
        block_columns = torch.arange(own.capacity, device=token.device)  # (S_block,)
        with own.fixed_write(block_at.view(1), 0):
            logits = d.block(h, block_at.view(1, 1), one_row_mask(block_at, block_columns, h.dtype), own)[0, -1]
        return logits, h[0, 0]  # (N|V,), (d,)
