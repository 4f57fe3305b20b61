"""Draft trees as a parent array, and the small pure functions derived from it.

Node 0 is the root: the pending token (committed, but its key/value entries are not in the target cache yet).
Nodes 1..N are draft tokens; parent[i] < i (topological order). A chain is the tree with parent[i] = i - 1.

The mask and position helpers build on the CPU on purpose (a Python loop of row copies would be one tiny kernel
launch per node on a GPU); the runner moves each result to the model's device in one copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch


class Flavor(StrEnum):
    """How a node's children were produced; recursive rejection sampling must know it to stay lossless."""

    WITH_REPLACEMENT = "with_replacement"  # i.i.d. samples from q (a chain draft is one such sample)
    WITHOUT_REPLACEMENT = "without_replacement"  # samples from q without replacement, in draw order
    DETERMINISTIC = "deterministic"  # chosen without sampling (top-k, n-gram lookup): q is a point mass


@dataclass
class DraftTree:
    """A proposal: tokens, parents, and the draft distribution q at every expanded node.

    q_dists[i] is the (V,) draft distribution the children of node i were drawn from (None for a
    deterministic drafter or a leaf). q_token[i] is q(token[i]) under the parent's distribution, for display.
    """

    tokens: list[int]  # [root, d_1, ..., d_N]
    parents: list[int]  # parents[0] = -1
    flavor: Flavor = Flavor.WITH_REPLACEMENT
    q_dists: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> (V,) warped draft distribution
    q_token: list[float | None] = field(default_factory=list)  # per node, None for the root / deterministic

    @classmethod
    def root_only(cls, pending: int) -> "DraftTree":
        return cls(tokens=[pending], parents=[-1], q_token=[None])

    def add(self, parent: int, token: int, q_token: float | None = None) -> int:
        """Append a child of `parent`; returns its node id."""
        if not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} does not exist (tree has {len(self.tokens)} nodes)")
        self.tokens.append(token)
        self.parents.append(parent)
        self.q_token.append(q_token)
        return len(self.tokens) - 1

    @property
    def size(self) -> int:
        """Number of nodes including the root."""
        return len(self.tokens)

    @property
    def n_drafted(self) -> int:
        return len(self.tokens) - 1

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))


def children(parents: list[int]) -> list[list[int]]:
    """children[i] = child node ids of i in insertion order (the order recursive rejection tries them)."""
    kids: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            kids[parent].append(node)
    return kids


def depths(parents: list[int]) -> list[int]:
    """depth[0] = 0, depth[i] = depth[parent[i]] + 1."""
    out = [0] * len(parents)
    for node in range(1, len(parents)):
        out[node] = out[parents[node]] + 1
    return out


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """A[i, j] = True iff j lies on the path root -> i (inclusive). Shape (N+1, N+1), bool."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool, device="cpu")  # (N+1, N+1)
    for node in range(n):
        if parents[node] >= 0:
            mask[node] = mask[parents[node]]  # inherit the parent's ancestors
        mask[node, node] = True
    return mask


def position_ids(parents: list[int], past_len: int) -> torch.Tensor:
    """Position of node i = past_len + depth(i): siblings share a position, like one left-to-right pass."""
    return torch.tensor([past_len + d for d in depths(parents)], dtype=torch.long, device="cpu")  # (N+1,)


def attention_mask_4d(parents: list[int], past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (1, 1, N+1, past_len+N+1): 0 where a node may attend, the dtype's minimum elsewhere.

    Float, not bool: eager attention adds the mask to the scores, so a bool mask would be silently wrong.
    """
    allowed = ancestor_mask(parents)  # (N+1, N+1)
    n = len(parents)
    full = torch.ones(n, past_len + n, dtype=torch.bool, device="cpu")  # (N+1, L+N+1): every node sees the cache
    full[:, past_len:] = allowed
    mask = torch.zeros(n, past_len + n, dtype=dtype, device="cpu")  # (N+1, L+N+1)
    mask.masked_fill_(~full, torch.finfo(dtype).min)
    return mask[None, None]  # (1, 1, N+1, L+N+1)


def path_to(parents: list[int], node: int) -> list[int]:
    """Node ids from the root to `node`, inclusive."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def root_to_leaf_paths(parents: list[int]) -> list[list[int]]:
    """Every root-to-leaf path, leaves in node order."""
    kids = children(parents)
    return [path_to(parents, node) for node in range(len(parents)) if not kids[node]]
