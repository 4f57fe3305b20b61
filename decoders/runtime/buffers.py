"""Static KV buffers: one preallocated cache per model per run, written at fixed slots (gpt-fast's KV cache).

Why: transformers' DynamicCache appends by concatenation, so every forward copies each layer's whole cache into a
new tensor, and no two steps have the same shapes or addresses. A buffer sized once from the run's budget keeps
both: rollback and tree compaction become index moves inside it, and on a GPU a step whose tensors never move can
be captured as a CUDA graph and replayed (decoders/runtime/graphs.py).

The invariant every verb keeps: in each layer the valid slots are a prefix 0..length-1, and slot j holds position j
of the committed sequence. A forward writes its tokens at slots length.. onwards. Then
- rollback (drop_last) is `length -= n`: the stale entries stay where they are, no mask lets a query see them, and
  the next write overwrites them;
- a verified tree path (keep_path) gathers the kept nodes' slots to the front of the block and sets length to the
  block's start + the kept count. Every layer's keys and values are views of one (L, 2, B, H, S, D) tensor
  (`_Storage`), so that is one gather and one scatter for all layers, not two index copies per layer and tensor
  (~180 launches a round on a 30-layer model); a layer shaped unlike the first (heads, head size) keeps its own
  buffers, and compaction then goes layer by layer.
Layers keep their own lengths: early exit's stem layers hold a round's drafts before the upper layers do, and layer
skip writes only the layers it runs.

A layer is read in one of two ways (what `update` returns to attention):
- view: the valid prefix keys[:, :, :length] after the write. Shapes grow with the sequence, so any mask built for a
  DynamicCache (past + n keys) fits: the drafters that run layers by hand (early exit's stem, a draft tree's
  frontier, the EAGLE head) use this, and so does every forward of kv_cache="static".
- fixed: the whole buffer, `capacity` keys, with the forward's own 4-D mask hiding every slot that is not valid.
  Every forward of a given width then has one shape and one set of addresses, which is what a captured CUDA graph
  replays (kv_cache="fixed"; decoders/runtime/graphs.py builds its inputs). The runner turns it on for its own forwards
  (`BufferCache.fixed_write`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from ..errors import OptionsError

KV_CACHES = ("auto", "dynamic", "static", "fixed")
# Widths a fixed-shape forward is padded to (decoders/runtime/graphs.py captures one graph per width): a one-token step,
# then powers of two up to EAGLE-2's paper tree (M 59 + the root = 60 -> 64). Wider forwards (a prefill, a 100-node
# tree) run at their own width, eagerly.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class BufferFull(RuntimeError):
    """A forward would write past the buffer's last slot: the run's budget was computed wrong (a bug)."""


@dataclass(frozen=True)
class KVPlan:
    """How one run keeps its KV caches: which kind, and for buffers how many committed tokens they must hold.

    kind: "dynamic" (transformers' DynamicCache), "static" (buffers read as views) or "fixed" (buffers read whole, at
    bucketed widths). committed: prompt + max_new_tokens, the most tokens a run ever keeps; each model adds the widest
    block it writes on top (`capacity`). graphs: replay captured CUDA graphs for the fixed-shape forwards."""

    kind: str = "dynamic"
    committed: int = 0
    graphs: bool = False
    buckets: tuple[int, ...] = BUCKETS

    @property
    def static(self) -> bool:
        return self.kind in ("static", "fixed")

    @property
    def fixed(self) -> bool:
        return self.kind == "fixed"

    @property
    def path(self) -> str:
        """How the forwards go, for pricing them (decoders/costs.py PATHS): the kind, or "graphs" when replayed."""
        return "graphs" if self.graphs and self.fixed else self.kind

    def capacity(self, widest: int) -> int:
        """Slots per layer for a model whose widest write after the committed tokens is `widest` tokens (a tree,
        a draft tree's frontiers), plus the padding of a fixed-shape forward to its bucket. With graphs, rounded up
        to a power of two (at least 256): runs of similar length then share one kept buffer and its graphs."""
        padding = max(self.buckets, default=0) if self.fixed else 0
        slots = self.committed + max(widest, 0) + padding
        return max(256, 1 << (slots - 1).bit_length()) if self.graphs else slots


def resolve(kind: str, device: torch.device, graphs: bool = False) -> str:
    """The kv_cache option for this run: "auto" is the DynamicCache, the path every measured figure so far ran on,
    unless cuda_graphs asks for fixed shapes. Static buffers become auto's choice only where a measurement shows them
    not slower: on a CPU bench.gpu_cpu_trees races the three kinds, on a GPU `python -m bench.gpu` (its baseline
    arms: DynamicCache, fixed eager, graphs) has yet to run. `device` is where the run decodes (kept for that
    choice)."""
    if kind != "auto":
        return kind
    return "fixed" if graphs else "dynamic"


def check_graphs(graphs: bool, device: torch.device) -> None:
    """CUDA graphs replay on a GPU only (DecodeOptions.validate already refused them with a growing cache)."""
    if graphs and device.type != "cuda":
        raise OptionsError(f"cuda_graphs replays captured CUDA graphs, but this run is on {device.type}; set "
                           "cuda_graphs=False, or load the model on a GPU (device='cuda')")


class _WriteIndex:
    """Where a fixed-shape forward writes: set by the runner for one forward, read by every layer (one object, shared
    by the cache's layers)."""

    def __init__(self):
        self.slots: torch.Tensor | None = None  # (w,) on the model's device; None: layers write as views
        self.real = 0  # of the w slots, how many hold real tokens (the rest is bucket padding)


class _Storage:
    """Every layer's keys and values as views of one (L, 2, B, H, S, D) tensor, allocated at the first write (shaped
    after it), so that compaction moves all layers in one gather (`BufferCache.keep_path`)."""

    def __init__(self, layers: int, capacity: int):
        self.layers, self.capacity = layers, capacity
        self.tensor: torch.Tensor | None = None  # (L, 2, B, H, S, D)

    def views(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer `layer`'s (keys, values) buffers, each (B, H, S, D), for a first write shaped like keys/values;
        None when it does not fit the shared tensor (another head count or size, dtype or device)."""
        batch, heads, _, dim = keys.shape
        if values.shape != keys.shape or values.dtype != keys.dtype:
            return None
        if self.tensor is None:
            self.tensor = keys.new_zeros(self.layers, 2, batch, heads, self.capacity, dim)  # (L, 2, B, H, S, D)
        shared = self.tensor
        if (shared.shape[2], shared.shape[3], shared.shape[5], shared.dtype, shared.device) != \
                (batch, heads, dim, keys.dtype, keys.device):
            return None
        return shared[layer, 0], shared[layer, 1]  # (B, H, S, D) views


class BufferLayer(CacheLayerMixin):
    """One layer's keys and values as (1, kv_heads, capacity, head_dim) buffers plus its valid length."""

    is_croppable = True

    def __init__(self, capacity: int, index: _WriteIndex, sliding: bool = False, storage: _Storage | None = None,
                 number: int = 0):
        super().__init__()
        self.capacity = capacity
        self.index = index
        self.is_sliding = sliding  # transformers sizes each mask kind from its first layer; all keep full history
        self.length = 0
        self.storage, self.number = storage, number  # the cache's shared tensor and this layer's row in it
        self.shared = False  # whether keys and values are views of the shared tensor

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Take both buffers on the first write, shaped after it (heads, head size, dtype and device): views of the
        cache's shared tensor, or this layer's own when it is shaped unlike the first layer."""
        views = self.storage.views(self.number, key_states, value_states) if self.storage is not None else None
        if views is not None:
            self.keys, self.values = views  # (1, H, S, D) each
        else:
            batch, heads, _, key_dim = key_states.shape
            self.keys = key_states.new_zeros(batch, heads, self.capacity, key_dim)  # (1, H, S, D)
            self.values = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])  # (1, H, S, D)
        self.shared = views is not None
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the forward's n keys/values after the valid prefix; return what attention reads (see the module)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            raise BufferFull(f"a forward of {n} tokens after {self.length} would pass the KV buffer's {self.capacity} "
                             "slots (the run's budget was computed wrong; kv_cache='dynamic' avoids it)")
        slots = self.index.slots
        if slots is not None:  # fixed: write at the runner's slots, attend over the whole buffer
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            self.length += self.index.real
            return self.keys, self.values
        end = self.length + n
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.index.slots is not None:
            return self.capacity, 0
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        """DynamicLayer's crop(-n): forget the newest n entries (the slots stay, unseen, until overwritten)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of entries to remove, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0

    def keep(self, block: int, keep: torch.Tensor) -> None:
        """The last `block` valid slots hold tree nodes 0..block-1: move nodes `keep` (ascending) to the block's
        front in that order and forget the rest. keep: (k,) on the buffer's device."""
        start = self.length - block
        if start < 0:
            raise ValueError(f"keep_path over {block} nodes, but this layer holds only {self.length} entries")
        if self.is_initialized:
            source = keep + start  # (k,) slots of the kept nodes
            target = torch.arange(start, start + keep.numel(), device=keep.device)  # (k,) the block's front
            for tensor in (self.keys, self.values):
                tensor.index_copy_(2, target, tensor.index_select(2, source))  # gather first: slots may overlap
        self.length = start + keep.numel()

    def held_bytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class BufferCache(Cache):
    """A transformers Cache of BufferLayers, one per decoder layer (the model's layer types from its config)."""

    def __init__(self, config, capacity: int):
        types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        unsupported = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
        if unsupported:
            raise OptionsError(f"static KV buffers hold attention layers only; this model has {', '.join(unsupported)}"
                               " layers: use kv_cache='dynamic'")
        self.index = _WriteIndex()
        self.capacity = capacity
        self.storage = _Storage(len(types), capacity)
        super().__init__(layers=[BufferLayer(capacity, self.index, t == "sliding_attention", self.storage, i)
                                 for i, t in enumerate(types)])

    @contextmanager
    def fixed_write(self, slots: torch.Tensor, real: int):
        """For one forward: every layer writes its w entries at `slots` (w,), counts `real` of them as valid, and
        returns its whole buffer (the caller's mask covers it)."""
        self.index.slots, self.index.real = slots, real
        try:
            yield
        finally:
            self.index.slots, self.index.real = None, 0

    def advance(self, n: int) -> None:
        """Count n more valid entries in every layer (after a graph replay, whose writes ran no Python)."""
        for layer in self.layers:
            layer.length += n

    def lengths(self) -> list[int]:
        return [layer.length for layer in self.layers]

    def set_lengths(self, lengths: list[int]) -> None:
        for layer, length in zip(self.layers, lengths):
            layer.length = length

    @torch.inference_mode()  # the buffers were made under inference mode; in-place writes must be too
    def keep_path(self, block: int, keep: list[int]) -> None:
        """decoders.runtime.cache.keep_path for buffers: a chain prefix is a length move, a tree path one gather over
        every layer (layer by layer only where a layer keeps its own buffers)."""
        if keep == list(range(len(keep))):
            for layer in self.layers:
                layer.crop(-(block - len(keep)))
            return
        starts = [layer.length - block for layer in self.layers]  # each layer's block may start elsewhere
        short = next((layer for layer, start in zip(self.layers, starts) if start < 0), None)
        if short is not None:
            raise ValueError(f"keep_path over {block} nodes, but a layer holds only {short.length} entries")
        if self.storage.tensor is None or not all(layer.shared or not layer.is_initialized for layer in self.layers):
            device = next((layer.keys.device for layer in self.layers if layer.is_initialized), "cpu")
            index = torch.tensor(keep, device=device)  # (k,)
            for layer in self.layers:
                layer.keep(block, index)
            return
        _compact(self.storage.tensor, starts, keep)
        for layer, start in zip(self.layers, starts):
            layer.length = start + len(keep)

    def held_bytes(self) -> int:
        """The buffers' whole allocation: what the run holds, whatever part of it is valid."""
        shared = self.storage.tensor
        own = sum(layer.held_bytes() for layer in self.layers if not layer.shared)
        return own + (shared.numel() * shared.element_size() if shared is not None else 0)


def compaction_slots(starts: list[int], keep: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Per layer, the slots of the kept nodes (from) and the block's front they move to (to). Each (L, k)."""
    return ([[start + node for node in keep] for start in starts],
            [[start + i for i in range(len(keep))] for start in starts])


def _compact(shared: torch.Tensor, starts: list[int], keep: list[int]) -> None:
    """Move every layer's kept nodes to its block's front: one gather, then one scatter. shared (L, 2, B, H, S, D)."""
    layers, _, batch, heads, _, dim = shared.shape
    source, target = compaction_slots(starts, keep)
    index = torch.tensor([source, target], device=shared.device)  # (2, L, k): the one upload
    spread = index.view(2, layers, 1, 1, 1, len(keep), 1).expand(2, layers, 2, batch, heads, len(keep), dim)
    moved = shared.gather(4, spread[0])  # (L, 2, B, H, k, D), gathered first: the slots may overlap
    shared.scatter_(4, spread[1], moved)
