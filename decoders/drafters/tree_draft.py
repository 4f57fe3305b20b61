"""EAGLE-2 dynamic draft trees (Li et al. 2024) and Dynamic Depth Decoding on top (DDD, Brown et al. 2024).

One expansion engine, any scorer that gives the draft's next-token log-probabilities for a whole frontier at once:
  step 1     the root's top-K tokens enter the pool; they are the first frontier
  step s>1   one draft forward over the frontier (tree mask: each node sees the context and its own ancestors);
             each frontier node's top-K children enter the pool (F·K new nodes); the `width` best by value are
             the next frontier
  value      product of the draft probabilities on the path from the root (kept as a sum of log-probabilities)
  rerank     the M best pool nodes by value. A child's value never exceeds its parent's, so with ties broken by
             depth then pool order the top M are ancestor-closed: a tree, not a bag of nodes
DDD stops growing early: before expansion step s in `checks` it computes the frontier's confidence
H = logsumexp(cumulative log-probs of the frontier) and stops when H < x.

Candidates are the draft's top-K, chosen, not sampled, so the tree is verified as Flavor.DETERMINISTIC: recursive
rejection sampling with point-mass proposals, lossless at any temperature (decoders/verify.py).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..runtime.cache import sliding_window
from ..errors import OptionsError
from ..runtime.runner import CachedModel
from ..sampling import Warp, raw_probs
from ..tree import DraftTree, Flavor
from .base import Drafter, DraftStop, Proposal, ReadsPrompt
from .device_tree import DeviceGrowth, Frontier, grow_on_device, read

# EAGLE-1 / Medusa style static tree: each path lists, per depth, the rank of the draft's candidate to take (0 = its
# most likely token). Top-heavy like the trees those papers use: wide near the root, one deep chain of top-1 picks.
# SpecLab's own 24-node choice, not a copy of either paper's tuned tree.
STATIC_TREE = ((0,), (1,), (2,), (3,),
               (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
               (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
               (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0),
               (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0),
               (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0))


@dataclass(frozen=True)
class TreeShape:
    """How a dynamic tree grows. EAGLE-2: width = k, no checks. DDD: checks, x, steps = n, width = w.

    No defaults for the shape itself: the papers' values are DecodeOptions' defaults (decoders/options.py)."""

    k: int  # top-k children per expanded node (EAGLE-2's K)
    steps: int  # most expansion steps (EAGLE-2's depth D; DDD's n)
    m: int  # draft nodes sent to the target (EAGLE-2's M)
    width: int | None = None  # frontier kept per step; None = k (EAGLE-2); DDD's beam width w
    checks: tuple[int, ...] = ()  # expansion steps before which DDD checks its confidence (S)
    threshold: float = -math.inf  # DDD's x: stop when H < x
    paths: tuple[tuple[int, ...], ...] = ()  # a static tree (EAGLE-1): every node's path of candidate ranks

    def __post_init__(self):
        for name in ("k", "steps", "m"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"tree {name} must be a whole number of at least 1, got {getattr(self, name)!r}")
        if self.width is not None and self.width < 1:
            raise ValueError(f"tree width must be at least 1 (or None for k), got {self.width!r}")

    @property
    def beam(self) -> int:
        return self.width if self.width is not None else self.k

    @classmethod
    def static(cls, paths: tuple[tuple[int, ...], ...] = STATIC_TREE) -> "TreeShape":
        """EAGLE-1's static tree: every path is sent (M = its node count), depth = its longest path."""
        paths = tuple(tuple(p) for p in paths)
        missing = [p for p in paths if len(p) > 1 and p[:-1] not in set(paths)]
        if not paths or missing or any(not p or min(p) < 0 for p in paths):
            raise ValueError(f"a static tree is a non-empty list of rank paths in which every path's parent is "
                             f"listed too (e.g. 0; 1; 0,0); missing parents of {missing[:3]}" if missing else
                             "a static tree is a non-empty list of rank paths of whole numbers from 0 (e.g. 0; 1; 0,0)")
        return cls(k=max(max(p) for p in paths) + 1, steps=max(len(p) for p in paths), m=len(paths), paths=paths)

    @classmethod
    def ddd(cls, k: int, m: int, checks: tuple[int, ...], threshold: float, steps: int, width: int) -> "TreeShape":
        return cls(k=k, steps=steps, m=m, width=width, checks=tuple(checks), threshold=threshold)


@dataclass
class PoolNode:
    parent: int  # pool id, -1 = the root
    token: int
    log_value: float  # sum of draft log-probs on the path: log of EAGLE-2's value
    log_q: float  # draft log-prob of this token under its parent's distribution
    depth: int
    step: int


@dataclass
class Growth:
    pool: list[PoolNode] = field(default_factory=list)
    frontiers: list[list[int]] = field(default_factory=list)
    ddd: list[dict] = field(default_factory=list)
    steps: int = 0
    stop: str = "depth"
    forwards: int = 0


def grow(root_logq: torch.Tensor, expand: Callable[[Frontier], torch.Tensor], shape: TreeShape, max_depth: int,
         keep_growing: Callable[[list[float], list[float], int], bool] | None = None) -> Growth | DeviceGrowth:
    """Grow the candidate pool. root_logq: (V,) draft log-probs after the root; expand(frontier) -> (F, V)
    log-probs after each frontier node (one draft forward); keep_growing(frontier values, pool values best first,
    forwards so far) can end growth before a step (the draft controller: when the frontier cannot pay for another
    step). A dynamic tree grows on the device (decoders/drafters/device_tree.py), a static one on the host."""
    if shape.paths:
        return grow_static(root_logq, expand, shape.paths, max_depth)
    return grow_on_device(root_logq, expand, shape, max_depth, keep_growing)


def grow_static(root_logq: torch.Tensor, expand, paths: tuple[tuple[int, ...], ...], max_depth: int) -> Growth:
    """EAGLE-1's static tree: depth by depth, each listed path takes its parent's candidate of the listed rank.
    One draft forward per depth over the nodes that have children; paths deeper than max_depth are left out."""
    growth = Growth(forwards=1)
    node_of: dict[tuple[int, ...], int] = {}
    slots: dict[int, int] = {}  # pool id -> its draft slot (feeding order)
    fed_before: list[int] = []  # the previous forward's nodes, in row order
    depth_cap = min(max(len(p) for p in paths), max_depth)
    for depth in range(1, depth_cap + 1):
        level = [p for p in paths if len(p) == depth]
        if depth == 1:
            rows, logq = {(): 0}, root_logq[None]  # (1, V)
        else:
            parents = list(dict.fromkeys(node_of[p[:-1]] for p in level))  # pool ids, first-listed first
            logq = expand(_static_frontier(parents, growth.pool, fed_before, slots, root_logq.device))  # (F, V)
            slots.update({pool_id: slot for slot, pool_id in enumerate(parents, start=len(slots))})
            fed_before = parents
            growth.forwards += 1
            rows = {path: parents.index(pool_id) for path, pool_id in node_of.items() if pool_id in parents}
        ranked = torch.topk(logq, max(p[-1] for p in level) + 1, dim=-1)  # values, indices: (F, R)
        values, tokens = _level_read(ranked)  # (F, R) lists: one read a level, not two a node
        for path in level:
            row = rows[path[:-1]]
            log_q, token = values[row][path[-1]], tokens[row][path[-1]]
            parent = node_of.get(path[:-1], -1)
            base = growth.pool[parent].log_value if parent >= 0 else 0.0
            growth.pool.append(PoolNode(parent=parent, token=token, log_value=base + log_q, log_q=log_q, depth=depth,
                                        step=depth))
            node_of[path] = len(growth.pool) - 1
        growth.frontiers.append([node_of[p] for p in level])
        growth.steps = depth
    growth.stop = "depth" if depth_cap == max(len(p) for p in paths) else "budget"
    return growth


def _level_read(ranked) -> tuple[list[list[float]], list[list[int]]]:
    """A level's ranked candidates on the host: log q (as the doubles float() made) and token ids, (F, R) each."""
    rows = ranked.values.shape[0]
    host = torch.cat([ranked.values.double(), ranked.indices.double()]).cpu().tolist()  # (2F, R)
    return host[:rows], [[int(t) for t in row] for row in host[rows:]]


def _static_frontier(parents: list[int], pool: list[PoolNode], fed_before: list[int], slots: dict[int, int],
                     device: torch.device) -> Frontier:
    """A static tree's nodes to expand as a Frontier (built on the host: the static tree is not the device path)."""
    seen = torch.zeros(len(parents), len(slots), dtype=torch.bool)  # (F, fed)
    for row, pool_id in enumerate(parents):
        ancestor = pool[pool_id].parent
        while ancestor != -1:
            seen[row, slots[ancestor]] = True
            ancestor = pool[ancestor].parent
    rows = [fed_before.index(pool[i].parent) if pool[i].parent >= 0 else 0 for i in parents]  # 0: the root's row
    as_tensor = functools.partial(torch.tensor, device=device)
    return Frontier(as_tensor(parents), as_tensor([pool[i].token for i in parents]), as_tensor(rows),
                    seen.to(device), pool[parents[0]].depth, len(slots))


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


def tree_proposal(method: str, pending: int, growth: Growth | DeviceGrowth, m: int, record: bool,
                  rule=None) -> Proposal:
    """The grown pool reranked to its best m nodes (ancestor-closed) as the tree sent to the target; the search
    itself goes into the trace when recording. A rule may send fewer (DraftRule.tree_size: the draft controller).
    DDD's and the controller's stops read as the rule's, EAGLE-2's as the size limit."""
    if isinstance(growth, DeviceGrowth):
        done = read(growth, pending, m, record, rule)  # reranked on the device, one host read
        proposal = Proposal(done.tree, forwards=growth.forwards, reason=_reason(done.stop))
        if record:
            proposal.search = {"method": method, "flavor": Flavor.DETERMINISTIC, "steps": done.steps,
                               "stop": done.stop, "pool": done.pool, "frontier": done.frontiers,
                               "chosen": done.chosen, "ddd": done.ddd}
        return proposal
    if rule is not None:
        values = sorted((math.exp(node.log_value) for node in growth.pool), reverse=True)
        m = max(1, min(m, rule.tree_size(values, growth.forwards, min(m, len(values)))))
    chosen = rerank(growth.pool, m)
    proposal = Proposal(build_tree(pending, growth.pool, chosen), forwards=growth.forwards,
                        reason=_reason(growth.stop))
    if record:
        proposal.search = search_record(method, growth, chosen)
    return proposal


def _reason(stop: str) -> DraftStop:
    return DraftStop.RULE if stop in ("ddd", "cost") else DraftStop.LIMIT


def draft_log_probs(logits: torch.Tensor, warp: Warp) -> torch.Tensor:
    """The distribution values are products of: the unwarped softmax under greedy (the greedy warp is one-hot and
    would rank nothing), the warped draft q under sampling. (..., V) -> (..., V)"""
    probs = raw_probs(logits) if warp.greedy else warp.probs(logits)  # (..., V)
    return torch.log(probs.clamp_min(1e-30))


class DynamicTreeDrafter(ReadsPrompt, Drafter):  # ReadsPrompt: its start (the prompt, in prefill chunks)
    """EAGLE-2's dynamic tree (or DDD's, by its shape) grown by a separate draft model with its own KV cache."""

    offers_distribution = True

    def __init__(self, model: nn.Module, shape: TreeShape, name: str = "eagle2"):
        if sliding_window(model) is not None:  # its frontiers pile up in the draft cache past what a window keeps
            raise OptionsError(f"the {name} drafter grows its tree in the draft model's cache, which a sliding-window "
                               "draft (Gemma 3) cannot hold; pick a draft without sliding-window attention "
                               "(qwen2.5-coder-0.5b, smollm2-135m) or a chain drafter for this pair")
        self.runner = CachedModel(model)
        self.shape = shape
        self.name = name

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        if limit <= 0:
            return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.BUDGET)
        unseen = ids[self.runner.length:]  # the pending token, and accepted tokens from the last round
        root_logits = self.runner.forward(unseen, last_only=True)[-1]  # (V,)
        context = self.runner.length  # the committed tokens; draft nodes go after them and are dropped after

        def expand(frontier: Frontier) -> torch.Tensor:
            return draft_log_probs(self._frontier_forward(frontier, context), warp)  # (F, V)

        growth = grow(draft_log_probs(root_logits, warp), expand, self.shape, limit, pricing_test(rule))
        self.runner.drop_last(self.runner.length - context)  # the draft cache keeps committed tokens only
        return tree_proposal(self.name, ids[-1], growth, self.shape.m, record, rule)

    def _frontier_forward(self, frontier: Frontier, context: int) -> torch.Tensor:
        """One draft forward over the frontier: each node sees the context and its own ancestors. (F, V)"""
        runner = self.runner
        mask = frontier.mask(context, runner.model.dtype)  # (F, L+F)
        positions = torch.full((1, frontier.size), context - 1 + frontier.depth, device=runner.device)  # (1, F)
        with torch.inference_mode():
            out = runner.model(input_ids=frontier.tokens[None].to(runner.device), attention_mask=mask[None, None],
                               position_ids=positions, past_key_values=runner.cache, use_cache=True)
        return out.logits[0]  # (F, V)

    def kv_peak_bytes(self) -> int:
        return self.runner.peak_bytes

    def use_kv(self, plan) -> None:
        self.runner = CachedModel(self.runner.model, plan, widest=growth_width(self.shape))

    def runtime(self) -> dict:
        return {"draft": self.runner.runtime()}

    def close(self) -> None:
        self.runner.release()


def pricing_test(rule):
    """The rule's between-steps test when it prices trees (a host read a step), else None: nothing to read."""
    return rule.keep_growing if rule is not None and rule.prices_trees else None


def growth_width(shape: TreeShape) -> int:
    """The most draft nodes one round's growth feeds the draft cache after the committed tokens: every frontier
    (at most `beam` nodes per expansion step), or a static tree's nodes."""
    return len(shape.paths) if shape.paths else shape.steps * shape.beam


def search_record(method: str, growth: Growth, chosen: list[int]) -> dict:
    """What the trace keeps of one round's search (schema in decoders/trace.py, RoundRecord.search)."""
    return {"method": method, "flavor": Flavor.DETERMINISTIC, "steps": growth.steps, "stop": growth.stop,
            "pool": [{"id": i, "parent": n.parent, "token": n.token, "value": math.exp(n.log_value),
                      "depth": n.depth, "step": n.step} for i, n in enumerate(growth.pool)],
            "frontier": [list(f) for f in growth.frontiers], "chosen": list(chosen), "ddd": list(growth.ddd)}
