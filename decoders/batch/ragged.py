"""One model + one batched KV cache whose rows hold different numbers of real tokens (ragged rows).

The cache is rectangular (B, kv_heads, width, head_dim) but each row owns only some of its slots: `valid` (B, width)
says which. A slot that is not valid is padding, and nothing ever attends to it. Each row's real tokens sit in its
valid slots in order, and a row's next position id is its count of real tokens (`lengths`), whatever the width.
The package docstring (decoders/batch/__init__.py) states the whole strategy; this module is its mechanics.
"""
from __future__ import annotations

import torch
from torch import nn

from ..runtime import cache as kv


class RaggedRunner:
    """model + a batched DynamicCache + which slot of which row is real. Rows are batch indices 0..B-1."""

    def __init__(self, model: nn.Module, batch: int):
        self.model = model
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype  # a transformers model or a self-drafter's module
        self.cache = kv.new_cache(model)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool)  # (B, width) on the CPU: real slots per row
        self.lengths = [0] * batch  # real tokens per row = the position id of its next token
        self.peak_bytes = 0
        self.padding_added = 0  # pad slots written since the last take_padding_counts()
        self.padding_removed = 0  # pad slots freed since then (crops, compaction, rows leaving)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def padding_held(self) -> int:
        return int(self.batch * self.width - self.valid.sum())

    def _positions(self, row: int, start: int, count: int) -> torch.Tensor:
        """Position ids of a row's `count` new real tokens: they continue the row's own sequence. (count,)

        A seam on purpose: the tests break it for one row (off by one) to show the equality test catches it."""
        return torch.arange(start, start + count)

    def layout(self, counts: list[int], lengths: list[int] | None = None, past_valid: torch.Tensor | None = None):
        """Where a block of new real tokens goes: row r's counts[r] tokens take the last counts[r] of n = max slots
        (left padding inside the block), at positions that continue the row's own sequence (lengths[r] onwards).
        past_valid (B, W) is what the block attends to (default: this cache's `valid`; early exit's stem passes
        its round's extra columns too). -> (block_valid (B, n), positions (B, n), mask (B, 1, n, W + n))"""
        lengths = self.lengths if lengths is None else lengths
        past_valid = self.valid if past_valid is None else past_valid
        n = max(counts)
        block_valid = torch.zeros(self.batch, n, dtype=torch.bool)  # (B, n)
        positions = torch.zeros(self.batch, n, dtype=torch.long)  # (B, n)
        for r, k in enumerate(counts):
            positions[r] = lengths[r]  # pads: any finite position (their keys are never visible)
            if k:
                block_valid[r, n - k:] = True
                positions[r, n - k:] = self._positions(r, lengths[r], k)
        keys_valid = torch.cat([past_valid, block_valid], dim=1)  # (B, W + n)
        mask = ragged_mask(keys_valid, past_valid.shape[1], self.dtype).to(self.device)  # (B, 1, n, W + n)
        return block_valid, positions.to(self.device), mask

    def commit(self, block_valid: torch.Tensor, counts: list[int]) -> None:
        """The block every layer of the cache has just appended (laid out by `layout`) is now part of the rows."""
        self.valid = torch.cat([self.valid, block_valid], dim=1)
        self.padding_added += int((~block_valid).sum())
        for r, k in enumerate(counts):
            self.lengths[r] += k
        self.peak_bytes = max(self.peak_bytes, kv.bytes_held(self.cache))

    @torch.inference_mode()
    def forward(self, tokens: list[list[int]], last_only: bool = False, hidden: bool = False):
        """One forward over every row's new tokens (row r: tokens[r], may be empty). Returns per row its logits
        (len(tokens[r]), V), or (1, V) for its last token if last_only (rows with no tokens: an empty (0, V)).
        hidden=True returns (logits, last hidden states) per row, shaped alike with H for V (a prophet reads them).

        The block is left-padded: row r's tokens take the last len(tokens[r]) of n = max len slots, so every row's
        last token sits in the block's last slot and last_only needs one logit row per batch row.
        """
        counts = [len(t) for t in tokens]
        if max(counts) == 0:
            empty = [torch.empty(0, 0) for _ in tokens]
            return (empty, list(empty)) if hidden else empty
        block_valid, positions, mask = self.layout(counts)
        n = block_valid.shape[1]
        ids = torch.zeros(self.batch, n, dtype=torch.long)  # (B, n); pad slots carry token 0, never attended to
        for r, row_tokens in enumerate(tokens):
            if row_tokens:
                ids[r, n - len(row_tokens):] = torch.tensor(row_tokens)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0,
                         output_hidden_states=hidden)
        self.commit(block_valid, counts)
        logits = self._per_row(out.logits, counts, last_only)  # (B, n, V) or (B, 1, V) -> per row
        return (logits, self._per_row(out.hidden_states[-1], counts, last_only)) if hidden else logits

    @torch.inference_mode()
    def forward_vectors(self, rows: list[torch.Tensor], last_only: bool = False) -> list[torch.Tensor]:
        """forward() for a module that reads vectors, not token ids, called as module(inputs (B, n, d), positions,
        mask, cache) (decoders/selfdraft/heads.py: the early-exit block reads h_k, a prophet its projected
        inputs). rows[r]: (k_r, d), may be empty. Returns what forward returns."""
        counts = [len(row) for row in rows]
        if max(counts) == 0:
            return [torch.empty(0, 0) for _ in rows]
        block_valid, positions, mask = self.layout(counts)
        n = block_valid.shape[1]
        width = next(row for row in rows if len(row)).shape[-1]
        inputs = torch.zeros(self.batch, n, width, dtype=self.dtype, device=self.device)  # (B, n, d); pads: zeros
        for r, row in enumerate(rows):
            if len(row):
                inputs[r, n - len(row):] = row
        out = self.model(inputs, positions, mask, self.cache)  # (B, n, V)
        self.commit(block_valid, counts)
        return self._per_row(out, counts, last_only)

    @staticmethod
    def _per_row(out: torch.Tensor, counts: list[int], last_only: bool) -> list[torch.Tensor]:
        """(B, n or 1, X) -> per row (counts[r], X), or (1, X) / (0, X) for its last token if last_only."""
        if last_only:
            return [out[r, -1:] if k else out[r, :0] for r, k in enumerate(counts)]
        n = out.shape[1]
        return [out[r, n - k:] for r, k in enumerate(counts)]

    @torch.inference_mode()  # `valid` was made in the forward's inference mode; in-place writes must be too
    def drop_row_tail(self, row: int, count: int) -> None:
        """Forget the newest `count` real tokens of one row (its rejected drafts): their slots become padding.
        Other rows are untouched; the slots are freed later by trim() or compact()."""
        if count <= 0:
            return
        real = self.valid[row].nonzero().flatten()  # (real slots,) ascending
        self.valid[row, real[-count:]] = False
        self.lengths[row] -= count

    def snapshot(self) -> tuple[int, list[int]]:
        """The width and lengths now; restore() returns to them (layer-skip drafting writes, then takes back)."""
        return self.width, list(self.lengths)

    def restore(self, snapshot: tuple[int, list[int]], layers: list[int]) -> None:
        """Drop every slot appended since `snapshot` from `layers` (the ones that ran) and from the bookkeeping."""
        width, lengths = snapshot
        self.padding_removed += int((~self.valid[:, width:]).sum())
        kv.drop_last(self.cache, self.width - width, layers)
        self.valid = self.valid[:, :width]
        self.lengths = lengths

    @torch.inference_mode()
    def select_rows(self, keep: list[int]) -> None:
        """Keep only the batch rows `keep` (in that order): finished rows leave without touching the others."""
        if keep == list(range(self.batch)):
            return
        gone = [r for r in range(self.batch) if r not in keep]
        self.padding_removed += int((~self.valid[gone]).sum())
        index = torch.tensor(keep, dtype=torch.long)
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))  # (B', H, W, D)
            layer.values = layer.values.index_select(0, index.to(layer.values.device))
        self.valid = self.valid[index]
        self.lengths = [self.lengths[r] for r in keep]

    @torch.inference_mode()
    def trim(self) -> None:
        """Cut columns that are padding in every row, at either end (a plain slice, no copy of what stays)."""
        if self.width == 0 or self.batch == 0:
            return
        used = self.valid.any(dim=0).nonzero().flatten()  # (columns with a real slot,)
        first, last = (int(used[0]), int(used[-1]) + 1) if len(used) else (self.width, self.width)
        if first == 0 and last == self.width:
            return
        self.padding_removed += int((~self.valid[:, :first]).sum() + (~self.valid[:, last:]).sum())
        for layer in self._layers():
            layer.keys = layer.keys[:, :, first:last, :]  # (B, H, W', D)
            layer.values = layer.values[:, :, first:last, :]
        self.valid = self.valid[:, first:last]

    def removable(self) -> int:
        """Columns compaction would free: the width minus the longest row's real tokens."""
        return self.width - (int(self.valid.sum(dim=1).max()) if self.batch else 0)

    @torch.inference_mode()
    def compact(self) -> None:
        """Move each row's real slots to the right end, in order (left padding again), and cut the width to the
        longest row. A gather of the whole cache: this is the copy that realignment costs."""
        counts = self.valid.sum(dim=1)  # (B,)
        width = int(counts.max()) if self.batch else 0
        index = torch.zeros(self.batch, width, dtype=torch.long)  # (B, W'): source slot of each new slot
        valid = torch.zeros(self.batch, width, dtype=torch.bool)  # (B, W')
        for r in range(self.batch):
            real = self.valid[r].nonzero().flatten()  # (counts[r],)
            index[r, width - len(real):] = real
            valid[r, width - len(real):] = True
        self.padding_removed += self.padding_held() - int((~valid).sum())
        for layer in self._layers():
            for name in ("keys", "values"):
                tensor = getattr(layer, name)  # (B, H, W, D)
                gather = index.to(tensor.device)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                setattr(layer, name, tensor.gather(2, gather))  # (B, H, W', D)
        self.valid = valid

    def realign(self, min_free: int = 8) -> None:
        """After a round: trim the all-padding columns; compact when at least a quarter of the width (and at
        least min_free columns) is holes that only compaction can free."""
        if self.batch == 0:  # every row has finished: nothing left to align
            return
        self.trim()
        free = self.removable()
        if free >= max(min_free, self.width // 4):
            self.compact()

    def take_padding_counts(self) -> tuple[int, int]:
        """(pad slots added, pad slots removed) since the last call."""
        counts = (self.padding_added, self.padding_removed)
        self.padding_added = self.padding_removed = 0
        return counts

    def kv_bytes(self) -> int:
        return kv.bytes_held(self.cache)

    def _layers(self):
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def release(self) -> None:
        self.cache = kv.new_cache(self.model)
        self.valid = torch.zeros(self.batch, 0, dtype=torch.bool)


def ragged_mask(keys_valid: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (B, 1, n, past + n) for a block of n new slots after `past` cached ones.

    Query i (slot past + i) sees key j iff j is a real slot of its row and j <= past + i (causal by slot: slot
    order is each row's token order). Every query also sees its own slot, so a pad query is never fully masked
    (a fully masked softmax row would give NaN keys for later layers); real queries never see pad keys.
    """
    batch, total = keys_valid.shape
    n = total - past
    slot = torch.arange(total)  # (past + n,)
    query = past + torch.arange(n)  # (n,)
    causal = slot[None, :] <= query[:, None]  # (n, past + n)
    allowed = keys_valid[:, None, :] & causal[None]  # (B, n, past + n)
    allowed |= (slot[None, :] == query[:, None])[None]  # (B, n, past + n): each query sees itself
    mask = torch.zeros(batch, 1, n, total, dtype=dtype)  # (B, 1, n, past + n)
    return mask.masked_fill(~allowed[:, None], torch.finfo(dtype).min)
