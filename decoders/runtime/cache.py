"""KV-cache verbs over transformers' DynamicCache and SpecLab's static buffers (decoders/runtime/buffers.py): drop the
newest entries, keep a verified tree path.

Every forward appends its tokens at the end of each layer's valid entries (batch, kv_heads, seq, head_dim), so a
tree that was just scored always occupies the last N+1 valid slots of every layer that ran. Both verbs work on
that tail, which keeps them correct for full and sliding-window layers alike; a buffer does it by index moves.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .buffers import BufferCache, BufferLayer


def new_cache(model, capacity: int | None = None) -> DynamicCache | BufferCache:
    """An empty cache shaped after the model's config: a DynamicCache, or with a capacity a static buffer of that
    many slots per layer. A DynamicCache's sliding layers keep their past so they can be cropped."""
    if capacity is not None:
        return BufferCache(model.config, capacity)
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
    return cache


def bytes_held(cache: DynamicCache | BufferCache) -> int:
    """Bytes held by the cache's key and value tensors (what a run costs in KV memory right now; a buffer holds its
    whole allocation from the first write)."""
    if isinstance(cache, BufferCache):
        return cache.held_bytes()
    total = 0
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total


def length(cache: DynamicCache) -> int:
    """Number of tokens cached (as layer 0 sees it; layer 0 always runs)."""
    return cache.get_seq_length()


def drop_last(cache: DynamicCache, n: int, layers: list[int] | None = None) -> None:
    """Remove the newest n entries from the given layers (all by default). Mutates the cache.

    Also the point where sliding layers shed what their window no longer needs: while they record their past
    (for rollback) they keep every entry until cropped, so n = 0 still crops, by nothing (a full layer's crop(0)
    is a no-op; a sliding layer's trims it to its last window - 1 entries). Every round ends here.
    """
    for index in layers if layers is not None else range(len(cache.layers)):
        cache.layers[index].crop(-max(n, 0))


def sliding_window(model) -> int | None:
    """The window of the model's sliding-attention layers, or None when every layer attends to the full past."""
    if "sliding_attention" not in (getattr(model.config, "layer_types", None) or ()):
        return None
    return model.config.sliding_window


def sliding_tree_mask(cache: DynamicCache, full_mask: torch.Tensor, positions: torch.Tensor,
                      window: int) -> torch.Tensor:
    """The tree mask a sliding layer needs: `full_mask` limited to keys within `window` positions of each query,
    cut to the keys that layer returns (its stored past, at most window - 1 entries, plus the new tokens).

    full_mask (1, 1, N+1, L+N+1) additive; positions (N+1,) the nodes' positions. Gemma's rule: query at p sees
    key at k iff p - k < window. The past occupies positions 0..L-1 in order; node keys sit at their positions.
    """
    n = positions.shape[0]
    past = full_mask.shape[-1] - n
    layer = next(layer for layer in cache.layers if getattr(layer, "is_sliding", False))
    keys = torch.cat([torch.arange(past, device=positions.device), positions])  # (L+N+1,)
    near = positions[:, None] - keys[None, :] < window  # (N+1, L+N+1)
    mask = full_mask.masked_fill(~near.to(full_mask.device), torch.finfo(full_mask.dtype).min)
    if isinstance(layer, BufferLayer):  # a buffer keeps every entry and hands attention all of them: no cut
        return mask
    stored = layer.keys.shape[2] if getattr(layer, "is_initialized", False) else 0
    visible = min(stored + n, window - 1 + n)  # what DynamicSlidingWindowLayer.update hands to attention
    return mask[..., -visible:].contiguous()  # (1, 1, N+1, visible)


@torch.inference_mode()  # the cache tensors were made under inference mode; in-place writes must be too
def keep_path(cache: DynamicCache, block: int, keep: list[int]) -> None:
    """The last `block` entries hold tree nodes 0..block-1; keep nodes `keep` (ascending, from 0) in that order.

    A chain prefix (keep = 0..k) is a plain crop; anything else copies the kept slots to the front of the block
    first (EAGLE's path compaction). Mutates the cache.
    """
    if isinstance(cache, BufferCache):
        cache.keep_path(block, keep)
        return
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
