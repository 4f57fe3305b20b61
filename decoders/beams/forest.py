"""The forest primitives DSBD needs: one draft tree per input beam, scored in one batched target forward.

Row i of the batch is input beam i's KV cache; its block holds column 0 = the beam's pending token and then the
draft nodes that descend from that beam, in layer order. Rows are padded to one length with dummy nodes hung under
column 0 (they see only the prefix, the root and themselves, and nothing reads their outputs). The mask and the
position ids come from decoders/tree.py, one tree per row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..tree import attention_mask_4d, position_ids
from .state import BeamRows


@dataclass
class Forest:
    """Where every draft node sits: its row (= root input beam) and its column in that row's block."""

    parents: list[list[int]]  # per row: the parent column of each column (column 0 has -1)
    tokens: list[list[int]]  # per row: the token of each column
    row: list[list[int]] = field(default_factory=list)  # row[l][j]: the row of layer-(l+1) draft j
    col: list[list[int]] = field(default_factory=list)  # col[l][j]: its column

    @classmethod
    def roots(cls, pending: list[int]) -> "Forest":
        return cls(parents=[[-1] for _ in pending], tokens=[[t] for t in pending])

    def add_layer(self, parents: list[int], tokens: list[int]) -> None:
        """Append one draft layer; parents index the previous layer's drafts (the input beams for layer 1)."""
        rows, cols = [], []
        for parent, token in zip(parents, tokens):
            row = parent if not self.row else self.row[-1][parent]
            parent_col = 0 if not self.col else self.col[-1][parent]
            self.parents[row].append(parent_col)
            self.tokens[row].append(token)
            rows.append(row)
            cols.append(len(self.tokens[row]) - 1)
        self.row.append(rows)
        self.col.append(cols)

    @property
    def width(self) -> int:
        """Columns per row after padding."""
        return max(len(t) for t in self.tokens)


@torch.inference_mode()
def forest_forward(target: BeamRows, forest: Forest) -> torch.Tensor:
    """Score every node of every tree in one forward. Returns float32 logits (rows, columns, V); [i, c] predicts
    the token after column c of row i. Appends `forest.width` entries to every cache row (commit trims them)."""
    start, n = target.length, forest.width
    parents = [p + [0] * (n - len(p)) for p in forest.parents]  # padding hangs under column 0
    tokens = [t + [t[0]] * (n - len(t)) for t in forest.tokens]
    dtype = next(target.model.parameters()).dtype
    mask = torch.cat([attention_mask_4d(p, start, dtype) for p in parents]).to(target.device)  # (I, 1, n, S+n)
    positions = torch.stack([position_ids(p, start) for p in parents]).to(target.device)  # (I, n)
    ids = torch.tensor(tokens, device=target.device)  # (I, n)
    out = target.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=target.cache,
                       use_cache=True)
    return out.logits.float()  # (I, n, V)


@torch.inference_mode()
def draft_forest_layer(rows: BeamRows, start: int, block: list[list[int]], places: list[tuple[int, int]],
                       tokens: list[int]) -> torch.Tensor:
    """Feed one layer of a draft forest into `rows`' own cache and return its logits, one row per new node (N, V).

    `block[r]` lists the parent column of every block column of row r (cached columns first, then this layer's,
    already appended); node k sits at places[k] = (row, column) and holds tokens[k]. Rows get equal column counts:
    a row with fewer new nodes is padded with copies of its root hung under column 0, which nothing descends from
    and whose outputs nobody reads (as in forest_forward). The padding stays in `block` so later masks line up.
    For the roots (layer 0): places (r, 0) and each row's pending token."""
    cached = rows.length - start  # block columns already in the cache (equal in every row)
    for row in block:
        while len(row) < max(len(b) for b in block):
            row.append(0)  # padding under the root
    n = len(block[0]) - cached
    by_column = {(row, col): k for k, (row, col) in enumerate(places)}
    ids = [[tokens[by_column[(r, c)]] if (r, c) in by_column else _root_token(r, places, tokens)
            for c in range(cached, cached + n)] for r in range(len(block))]
    dtype = next(rows.model.parameters()).dtype
    mask = torch.cat([attention_mask_4d(b, start, dtype)[:, :, cached:] for b in block])  # (R, 1, n, S+cached+n)
    positions = torch.stack([position_ids(b, start)[cached:] for b in block])  # (R, n)
    out = rows.model(input_ids=torch.tensor(ids, device=rows.device), attention_mask=mask.to(rows.device),
                     position_ids=positions.to(rows.device), past_key_values=rows.cache, use_cache=True)
    logits = out.logits.float()  # (R, n, V)
    return torch.stack([logits[row, col - cached] for row, col in places])  # (N, V)


def _root_token(row: int, places: list[tuple[int, int]], tokens: list[int]) -> int:
    """A padding column's token: any token will do (nothing reads it); the row's first new token, else 0."""
    return next((tokens[k] for k, (r, _) in enumerate(places) if r == row), 0)


@torch.inference_mode()
def keep_paths(target: BeamRows, prefix: int, roots: list[int], columns: list[list[int]]) -> None:
    """Commit after a forest forward: new row j = row roots[j]'s first `prefix` entries + its block columns
    `columns[j]` (equal lengths for every j). Everything else, padding included, is dropped."""
    index = [torch.tensor(list(range(prefix)) + [prefix + c for c in cols], device=target.device) for cols in columns]
    for layer in target.cache.layers:
        if getattr(layer, "is_initialized", False):
            layer.keys = torch.stack([layer.keys[r].index_select(1, i) for r, i in zip(roots, index)])  # (I', H, S', D)
            layer.values = torch.stack([layer.values[r].index_select(1, i) for r, i in zip(roots, index)])
