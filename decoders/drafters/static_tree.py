"""EAGLE-1's static tree grown on the device: the tree is fixed, so everything but the tokens and their log-probs is
known before the first round (issue 46: at most one host read a round, as the dynamic trees).

From the listed rank paths, once per (paths, device), per depth d (1-based):
  nodes      the paths of length d in listed order, pool ids start .. start + n - 1 (pool ids ascend with depth)
  parent     each node's parent's index among depth d-1's nodes (the root's children: none), and its pool id
  row, rank  each node's candidate: the rank-th best token of row `row` of the forward that scored its parent
             (row 0 of the root's log-probs at depth 1)
  fed        depth d-1's nodes that have children, first-listed first: the forward for depth d feeds them in that
             order after the `before` nodes fed earlier (feeding order, as device_tree.Frontier)
  rows, seen each fed node's parent's row in the forward before (0: the root's) and its ancestors' slots
A round is then, per depth, one top-k, a few gathers and one add on the device, and device_tree.read's one copy
(the chosen set is every node grown, or a pricing rule's best ones). The values are float64 sums of the float32
log q, the doubles the host engine's Python floats were.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .device_tree import DeviceGrowth, Frontier


@dataclass(frozen=True)
class _Depth:
    ids: torch.Tensor  # (n,) pool ids of the depth's nodes
    parent: torch.Tensor  # (n,) each node's parent's index among the depth before's nodes (0 at depth 1: unused)
    parent_ids: torch.Tensor  # (n,) the parents' pool ids, -1 = the root
    row: torch.Tensor  # (n,) the scoring forward's row of each node's parent
    rank: torch.Tensor  # (n,) which of that row's best tokens each node takes
    ranks: int  # the most ranks any node takes + 1 (the top-k to take)
    fed: torch.Tensor | None  # (F,) index among the depth before's nodes of the nodes this depth's forward feeds
    rows: torch.Tensor | None  # (F,) each fed node's parent's row in the forward before
    seen: torch.Tensor | None  # (F, before) bool: the fed nodes' ancestors' slots
    before: int  # slots fed by the forwards before this one


@torch.inference_mode()
def grow_static(root_logq: torch.Tensor, expand, paths: tuple[tuple[int, ...], ...], max_depth: int) -> DeviceGrowth:
    """EAGLE-1's static tree: depth by depth, each listed path takes its parent's candidate of the listed rank.
    One draft forward per depth over the nodes that have children; paths deeper than max_depth are left out."""
    depths = static_plan(paths, str(root_logq.device))
    growth = DeviceGrowth()
    alive = torch.ones((), dtype=torch.bool, device=root_logq.device)  # () a static tree has no stop check
    cap = min(len(depths), max_depth)
    logq = root_logq[None]  # (1, V) the root's row
    for d, level in enumerate(depths[:cap], start=1):
        if d > 1:
            tokens = growth.tokens[-1][level.fed]  # (F,)
            logq = expand(Frontier(depths[d - 2].ids[level.fed], tokens, level.rows, level.seen, d - 1, level.before))
            growth.forwards += 1
        top = torch.topk(logq, level.ranks, dim=-1)  # values, indices: (F, R)
        log_q = top.values[level.row, level.rank].double()  # (n,)
        log_value = log_q if d == 1 else growth.log_value[-1][level.parent] + log_q  # (n,)
        growth.add(level.parent_ids, top.indices[level.row, level.rank], log_q, log_value, alive)
        growth.frontiers.append(level.ids)
    growth.stop = "depth" if cap == len(depths) else "budget"
    return growth


@functools.lru_cache(maxsize=32)  # per (paths, device): uploaded once, not every round
def static_plan(paths: tuple[tuple[int, ...], ...], device: str) -> tuple[_Depth, ...]:
    """The static tree's per-depth index tensors (see the module docstring), on `device`."""
    node_of: dict[tuple[int, ...], int] = {}  # path -> pool id
    slot_of: dict[int, int] = {}  # pool id -> its draft slot (feeding order)
    fed_before: list[int] = []  # the previous forward's fed pool ids, in row order
    out = []
    for depth in range(1, max(len(p) for p in paths) + 1):
        level = [p for p in paths if len(p) == depth]
        start = len(node_of)
        previous = [node_of[p] for p in paths if len(p) == depth - 1]  # pool ids of the depth before, in order
        fed = list(dict.fromkeys(node_of[p[:-1]] for p in level)) if depth > 1 else [-1]  # -1: the root's row
        rows = [fed_before.index(_parent(node_of, i)) if _parent(node_of, i) >= 0 else 0
                for i in fed] if depth > 1 else []
        seen = [[slot_of.get(j, -1) for j in _ancestors(node_of, i)] for i in fed]
        node_of.update({path: start + n for n, path in enumerate(level)})
        parents = [node_of.get(p[:-1], -1) for p in level]
        as_long = functools.partial(torch.tensor, dtype=torch.long, device=device)
        seen_mask = torch.zeros(len(fed), len(slot_of), dtype=torch.bool)  # (F, before)
        for r, slots in enumerate(seen):
            seen_mask[r, [s for s in slots if s >= 0]] = True
        out.append(_Depth(
            ids=as_long(range(start, start + len(level))),
            parent=as_long([previous.index(p) if p >= 0 else 0 for p in parents]), parent_ids=as_long(parents),
            row=as_long([fed.index(p) for p in parents]), rank=as_long([p[-1] for p in level]),
            ranks=max(p[-1] for p in level) + 1,
            fed=as_long([previous.index(i) for i in fed]) if depth > 1 else None,
            rows=as_long(rows) if depth > 1 else None, seen=seen_mask.to(device) if depth > 1 else None,
            before=len(slot_of)))
        if depth > 1:
            slot_of.update({pool_id: slot for slot, pool_id in enumerate(fed, start=len(slot_of))})
            fed_before = fed
        else:
            fed_before = []
    return tuple(out)


def _parent(node_of: dict[tuple[int, ...], int], pool_id: int) -> int:
    path = next(p for p, i in node_of.items() if i == pool_id)
    return node_of.get(path[:-1], -1)


def _ancestors(node_of: dict[tuple[int, ...], int], pool_id: int) -> list[int]:
    """Pool ids of a node's ancestors, itself left out (the root is no slot)."""
    if pool_id < 0:
        return []
    path = next(p for p, i in node_of.items() if i == pool_id)
    return [node_of[path[:n]] for n in range(1, len(path))]
