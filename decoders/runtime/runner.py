"""A model plus its KV cache: the forward passes every method needs, and nothing else.

The cache is the only state; rollback is `drop_last` / `keep_path` (decoders/runtime/cache.py). Trees go through the stock
transformers model with a 4-D float mask and explicit position ids: no forked model files, no hidden attributes.

The cache is transformers' DynamicCache, or with a static KVPlan one preallocated buffer (decoders/runtime/buffers.py):
"static" reads it as growing views (the same masks as the DynamicCache), "fixed" runs every forward of this runner
over the whole buffer at a bucketed width (decoders/runtime/graphs.py), eagerly or, with plan.graphs on CUDA, as replayed
CUDA graphs. The loop and the drafters call the same verbs whichever it is.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from . import cache as kv
from .buffers import KVPlan
from .features import pick_features
from .graphs import FixedForward, give_back, lease
from ..tree import DraftTree, attention_mask_4d, position_ids

DYNAMIC = KVPlan()

# Prompt tokens per prefill forward. A run stops between two chunks, so this bounds how long Stop waits while a long
# prompt is read (Qwen2.5-Coder-1.5B on the 2-core CPU: about 5 s per chunk; SmolLM2 about 0.3 s). Fixed, not timed:
# the chunking changes the summation order, and two runs of one prompt must read it identically.
PREFILL_CHUNK = 128


class CachedModel:
    """model + its KV cache. `forward` appends its tokens to the cache and returns their logits.

    plan: how the run keeps KV (default: a DynamicCache); widest: the most tokens this model writes after the
    committed ones in one go (a verified tree, a draft tree's frontiers), which a buffer must leave room for."""

    def __init__(self, model: nn.Module, plan: KVPlan = DYNAMIC, widest: int = 0):
        self.model = model
        self.device = next(model.parameters()).device
        self.plan = plan
        self.capacity = plan.capacity(widest) if plan.static else None
        self.peak_bytes = 0  # the most KV memory this runner's cache has held after a forward, over its whole life
        self.fixed: FixedForward | None = None
        self._new_cache()

    def _new_cache(self, graphs: bool | None = None) -> None:
        """A fresh cache. With graphs, the model's kept buffers and graphs of this capacity (decoders/runtime/graphs.lease)."""
        graphs = self.plan.graphs if graphs is None else graphs
        window = kv.sliding_window(self.model)
        if self.plan.fixed and graphs:
            self.fixed = lease(self.model, self.capacity, self.plan.buckets, window)
            self.cache = self.fixed.cache
            return
        self.cache = kv.new_cache(self.model, self.capacity)
        if self.plan.fixed:
            self.fixed = FixedForward(self.model, self.cache, self.plan.buckets, window=window)

    @property
    def length(self) -> int:
        return kv.length(self.cache)

    @torch.inference_mode()
    def forward(self, tokens: list[int] | torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Causal forward over `tokens` after the cache. Returns logits (n, V), or (1, V) if last_only.
        tokens: a list, or an (n,) tensor on the model's device (a device chain's draft, never read to the host)."""
        if self.fixed is not None:
            logits, _ = self.fixed(tokens, list(range(-1, len(tokens) - 1)))  # (n, V): a chain
            self._note_peak()
            return logits[-1:] if last_only else logits
        start = self.length
        ids = torch.as_tensor(tokens, device=self.device)[None]  # (1, n)
        positions = torch.arange(start, start + len(tokens), device=self.device)[None]  # (1, n)
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0)
        self._note_peak()
        return out.logits[0]  # (n, V) or (1, V)

    @torch.inference_mode()
    def forward_tree(self, tree: DraftTree, hidden: bool | tuple[int, ...] = False):
        """One forward over every node of `tree` (root first). Returns logits (N+1, V); row i predicts after node i.

        hidden=True returns (logits, last hidden states (N+1, H)) from the same forward: an EAGLE head drafts from
        the target's features, and a second forward to get them would cost a whole target step. hidden=(k, ...)
        returns those layers' hidden states concatenated instead (N+1, len(k) * H): EAGLE-3's fused features.
        """
        if self.fixed is not None:
            logits, states = self.fixed(tree.tokens, tree.parents, hidden)  # (N+1, V), (N+1, H) | None
            self._note_peak()
            return (logits, states) if hidden else logits
        start = self.length
        ids = torch.tensor([tree.tokens], device=self.device)  # (1, N+1)
        if tree.is_chain():  # a chain needs no custom mask: the causal one is the ancestor relation
            positions = torch.arange(start, start + tree.size, device=self.device)[None]  # (1, N+1)
            mask = None
        else:
            positions = position_ids(tree.parents, start).to(self.device)[None]  # (1, N+1): past_len + depth
            mask = attention_mask_4d(tree.parents, start, self.model.dtype).to(self.device)  # (1, 1, N+1, L+N+1)
            window = kv.sliding_window(self.model)
            if window is not None:  # sliding layers see only the window and get fewer keys: a mask per layer type
                mask = {"full_attention": mask,
                        "sliding_attention": kv.sliding_tree_mask(self.cache, mask, positions[0], window)}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                         use_cache=True, output_hidden_states=bool(hidden))
        self._note_peak()
        if hidden:
            return out.logits[0], pick_features(out.hidden_states, hidden)[0]  # (N+1, V), (N+1, H or 3H)
        return out.logits[0]  # (N+1, V)

    def prefill(self, tokens: list[int], hidden: bool | tuple[int, ...] = False, chunk: int | None = None
                ) -> Iterator[tuple[int, torch.Tensor | None]]:
        """Feed `tokens` after the cache, `chunk` (PREFILL_CHUNK) at a time, yielding after each chunk (tokens fed so
        far, the chunk's last hidden states (n, H) when `hidden`, else None): a caller that stops iterating stops
        within one chunk."""
        chunk = chunk or PREFILL_CHUNK
        for start in range(0, len(tokens), chunk):
            part = tokens[start:start + chunk]
            if hidden:  # a chain through forward_tree: an EAGLE head drafts from these features
                chain = DraftTree(tokens=list(part), parents=list(range(-1, len(part) - 1)))
                yield start + len(part), self.forward_tree(chain, hidden=hidden)[1]  # (n, H or 3H)
            else:
                self.forward(part, last_only=True)
                yield start + len(part), None

    def _note_peak(self) -> None:
        self.peak_bytes = max(self.peak_bytes, kv.bytes_held(self.cache))

    def drop_last(self, n: int, layers: list[int] | None = None) -> None:
        kv.drop_last(self.cache, n, layers)

    def keep_path(self, block: int, keep: list[int]) -> None:
        kv.keep_path(self.cache, block, keep)

    @contextmanager
    def eager(self):
        """Forwards inside run eagerly, never as a captured graph (layer skip swaps layers out: no graph holds that)."""
        if self.fixed is None:
            yield
            return
        with self.fixed.eager():
            yield

    def runtime(self) -> dict:
        """How this runner kept its KV and ran its forwards, for the trace (Trace.runtime)."""
        out = {"kv_cache": self.plan.kind, "capacity": self.capacity}
        if self.fixed is not None:
            out.update(self.fixed.summary())
        return out

    def release(self) -> None:
        """Free the cache tensors (called from `finally` when a run ends or is cancelled). With graphs the buffers and
        graphs go back to the model's kept ones for the next run, and this runner goes on eagerly, if used again."""
        if self.fixed is not None and self.fixed.leased:
            give_back(self.fixed)
            self._new_cache(graphs=False)
            return
        self._new_cache()


class _PassThrough(nn.Module):
    """Stands in for a skipped decoder layer: returns the hidden states untouched and writes no cache entry."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder's layer list (model.model.layers for Llama, Qwen2 and Gemma3 causal LMs)."""
    return model.get_decoder().layers


@contextmanager
def skipping_layers(model: nn.Module, skip: set[int]):
    """Temporarily replace the layers in `skip` by pass-throughs; always restored, even on error or cancel.

    Layers keep their index, so per-layer cache slots and per-layer mask types (sliding vs full) stay right.
    """
    layers = decoder_layers(model)
    saved = {i: layers[i] for i in sorted(skip)}
    try:
        for i in saved:
            layers[i] = _PassThrough()
        yield
    finally:
        for i, layer in saved.items():
            layers[i] = layer
