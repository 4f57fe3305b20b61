"""The host engine EAGLE-2's trees were first grown with (plain Python per node), kept as the reference the device
engines (decoders/drafters/device_tree.py, static_tree.py) are checked against: the pool as a list of nodes, the
rerank by sorting, the tree built node by node."""
from __future__ import annotations

import math
from dataclasses import dataclass

from decoders.tree import DraftTree, Flavor


@dataclass
class PoolNode:
    parent: int  # pool id, -1 = the root
    token: int
    log_value: float  # sum of draft log-probs on the path: log of EAGLE-2's value
    log_q: float  # draft log-prob of this token under its parent's distribution
    depth: int
    step: int


def rerank(pool: list[PoolNode], m: int) -> list[int]:
    """The m best pool ids by value, returned in pool order (parents before children). Ancestor-closed: a child's
    value is at most its parent's, and ties go to the shallower, earlier node."""
    ranked = sorted(range(len(pool)), key=lambda i: (-pool[i].log_value, pool[i].depth, i))[:m]
    chosen = sorted(ranked)
    kept = set(chosen)
    assert all(pool[i].parent == -1 or pool[i].parent in kept for i in chosen), "rerank lost an ancestor"
    return chosen


def build_tree(pending: int, pool: list[PoolNode], chosen: list[int]) -> DraftTree:
    """The chosen pool nodes as a DraftTree rooted at the pending token; tree node i+1 = chosen[i]."""
    tree = DraftTree.root_only(pending)
    tree.flavor = Flavor.DETERMINISTIC
    node_of = {-1: 0}
    for pool_id in chosen:
        item = pool[pool_id]
        node_of[pool_id] = tree.add(node_of[item.parent], item.token, math.exp(item.log_q))
    return tree
