"""KV-cache verbs over transformers' DynamicCache: drop the newest entries, keep a verified tree path.

Every forward appends its tokens at the end of each layer's key/value tensors (batch, kv_heads, seq, head_dim),
so a tree that was just scored always occupies the last N+1 slots of every layer that ran. Both verbs work on
that tail, which keeps them correct for full and sliding-window layers alike.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    """An empty cache shaped after the model's config; sliding layers keep their past so they can be cropped."""
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
    return cache


def length(cache: DynamicCache) -> int:
    """Number of tokens cached (as layer 0 sees it; layer 0 always runs)."""
    return cache.get_seq_length()


def drop_last(cache: DynamicCache, n: int, layers: list[int] | None = None) -> None:
    """Remove the newest n entries from the given layers (all by default). Mutates the cache."""
    if n <= 0:
        return
    for index in layers if layers is not None else range(len(cache.layers)):
        cache.layers[index].crop(-n)


@torch.inference_mode()  # the cache tensors were made under inference mode; in-place writes must be too
def keep_path(cache: DynamicCache, block: int, keep: list[int]) -> None:
    """The last `block` entries hold tree nodes 0..block-1; keep nodes `keep` (ascending, from 0) in that order.

    A chain prefix (keep = 0..k) is a plain crop; anything else copies the kept slots to the front of the block
    first (EAGLE's path compaction). Mutates the cache.
    """
    if keep == list(range(len(keep))):
        drop_last(cache, block - len(keep))
        return
    index = torch.tensor(keep)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        for name in ("keys", "values"):
            tensor = getattr(layer, name)  # (B, H, S, D)
            tail = tensor[:, :, tensor.shape[2] - block :, :]  # (B, H, block, D)
            picked = tail.index_select(2, index.to(tensor.device))  # (B, H, len(keep), D)
            tail[:, :, : len(keep), :] = picked  # writes through the view into the layer's tensor
    drop_last(cache, block - len(keep))
