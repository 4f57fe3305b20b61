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

import math
from dataclasses import dataclass
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
from .static_tree import grow_static

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


def grow(root_logq: torch.Tensor, expand: Callable[[Frontier], torch.Tensor], shape: TreeShape, max_depth: int,
         keep_growing: Callable[[list[float], list[float], int], bool] | None = None) -> DeviceGrowth:
    """Grow the candidate pool. root_logq: (V,) draft log-probs after the root; expand(frontier) -> (F, V)
    log-probs after each frontier node (one draft forward); keep_growing(frontier values, pool values best first,
    forwards so far) can end growth before a step (the draft controller: when the frontier cannot pay for another
    step). Both grow on the device: a dynamic tree by decoders/drafters/device_tree.py, a static one (which never
    prices a step) by decoders/drafters/static_tree.py."""
    if shape.paths:
        return grow_static(root_logq, expand, shape.paths, max_depth)
    return grow_on_device(root_logq, expand, shape, max_depth, keep_growing)


def tree_proposal(method: str, pending: int, growth: DeviceGrowth, m: int, record: bool, rule=None) -> Proposal:
    """The grown pool reranked to its best m nodes (ancestor-closed) as the tree sent to the target; the search
    itself goes into the trace when recording. A rule may send fewer (DraftRule.tree_size: the draft controller).
    DDD's and the controller's stops read as the rule's, EAGLE-2's as the size limit."""
    done = read(growth, pending, m, record, rule)  # reranked on the device, one host read
    proposal = Proposal(done.tree, forwards=growth.forwards, reason=_reason(done.stop))
    if record:
        proposal.search = {"method": method, "flavor": Flavor.DETERMINISTIC, "steps": done.steps,
                           "stop": done.stop, "pool": done.pool, "frontier": done.frontiers,
                           "chosen": done.chosen, "ddd": done.ddd}
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
