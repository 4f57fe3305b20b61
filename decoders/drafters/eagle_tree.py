"""EAGLE-2 / DDD trees grown by an EAGLE draft head (decoders/eagle/head.py, or EAGLE-3's head3.py) instead of a
draft model.

The head reads pairs (f_i, t_{i+1}): the target's feature at position i and the token after it, and returns g_i,
its guess of f_{i+1}, with logits for t_{i+2}. Committed pairs use the target's real features, which the loop hands
over from the same forward that verified the tree (observe(features=...)): no second target forward. Inside a
draft tree a node's pair is (its parent's guessed feature, its token), so one head forward over the frontier, with a
tree mask over the head's own cache, expands the whole frontier: the same engine as the draft-model tree
(tree_draft.grow), only the scorer differs. The head's cache is one fixed buffer and each level's forward has a
fixed shape, replayed as a CUDA graph with cuda_graphs (decoders/drafters/head_step.py).
"""
from __future__ import annotations

import torch

from ..eagle.head import EagleHead
from ..eagle.head3 import Eagle3Head
from ..runtime.buffers import KVPlan
from ..runtime.graphs import give_back
from ..tree import DraftTree
from .base import Drafter, DraftStop, Proposal
from .device_tree import Frontier
from .head_step import HeadSteps, full_vocab, lease_steps
from .tree_draft import TreeShape, draft_log_probs, grow, growth_width, pricing_test, tree_proposal


# Slots of a head buffer that no run plan sized (a drafter built by hand): it doubles when the context outgrows it.
FIRST_CAPACITY = 256


class EagleTreeDrafter(Drafter):
    wants_target_hidden = True

    def __init__(self, head: EagleHead | Eagle3Head, shape: TreeShape, name: str = "eagle2-head"):
        self.head = head
        # The feature source: EAGLE-1/2's top feature, or EAGLE-3's fused layers, from the same verification forward
        # (runtime/features.pick_features). Everything below reads features as `head` takes them: an EAGLE-3 head
        # lifts fused target features (3d) through its fc and reads its own drafted features (d) as they are.
        self.wants_target_hidden = head.feature_layers or True
        self.shape = shape
        self.name = name
        self.device = next(head.parameters()).device
        self.plan = None  # the run's KVPlan (use_kv); None: a growable buffer
        self.steps = HeadSteps(head, FIRST_CAPACITY, growable=True)  # the head's KV buffer and level steps
        self.peak_bytes = 0
        self.known: list[torch.Tensor] = []  # real target features (d,) for positions fed .. fed + len - 1
        self.root_hidden: torch.Tensor | None = None  # (d,) the head's guess of the pending token's feature
        self.root_logits: torch.Tensor | None = None  # (V or N,) the head's logits after the pending token

    def start(self, ids: list[int], features: torch.Tensor | None = None) -> None:
        """features: (len(ids) - 1, d) target features of the prompt before the pending token (the prefill)."""
        if features is not None:
            self.known = list(features)

    def observe(self, n_before: int, n_accepted: int, path=None, features=None) -> None:
        """Keep the real features of the root and the accepted nodes: positions n_before - 1 onwards."""
        if features is not None:  # rows by int: views, where a list index would copy the list to the device
            self.known.extend(features[row] for row in [0] + list(path or [])[:n_accepted])  # (d,) each

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        self._catch_up(ids)
        if self.root_logits is None:  # no feature known yet (a one-token prompt): one plain target step first
            return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.NONE)
        if limit <= 0:
            return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.BUDGET)
        self.steps.make_room(self.steps.length + growth_width(self.shape))
        last = [self.root_hidden[None]]  # (rows, d) the previous step's guessed features (first: the root's)

        def expand(frontier: Frontier) -> torch.Tensor:
            last[0], logq = self.steps.step(frontier, last[0], warp)  # (F, d), (F, V)
            return logq

        growth = grow(full_vocab(self.head, draft_log_probs(self.root_logits, warp)), expand, self.shape, limit,
                      pricing_test(rule))
        self.peak_bytes = max(self.peak_bytes, self.steps.cache.held_bytes())
        return tree_proposal(self.name, ids[-1], growth, self.shape.m, record, rule)

    @torch.inference_mode()
    def _catch_up(self, ids: list[int]) -> None:
        """Feed every committed pair (f_i, t_{i+1}) whose feature is known; the last output is the root's."""
        fed = self.steps.length
        n = min(len(self.known), len(ids) - 1 - fed)  # pairs up to i = len(ids) - 2 (t_{i+1} = the pending token)
        if n <= 0:
            return
        self.steps.make_room(fed + n + growth_width(self.shape))
        feats = torch.stack(self.known[:n]).to(self.device)  # (n, d)
        # the committed tokens: the one upload a round (acceptance is decided on the host, decoders/verify.py)
        tokens = torch.tensor(ids[fed + 1: fed + 1 + n], device=self.device)  # (n,)
        self.root_hidden, self.root_logits = self.steps.feed(tokens, feats)  # (d,), (V|N,)
        self.known = self.known[n:]

    def kv_peak_bytes(self) -> int:
        return self.peak_bytes

    def use_kv(self, plan) -> None:
        """The run's plan sizes the head's buffer once (its committed tokens and a round's frontiers); with graphs
        the head's kept buffer and captured level steps are leased (head_step.lease_steps)."""
        self.plan = plan
        self._new_steps(plan.graphs)

    def _new_steps(self, graphs: bool) -> None:
        if self.plan is None or not self.plan.committed:
            self.steps = HeadSteps(self.head, FIRST_CAPACITY, growable=True)
            return
        room = growth_width(self.shape)
        capacity = KVPlan("static", self.plan.committed, graphs=graphs).capacity(room)  # graphs: a power of two
        self.steps = lease_steps(self.head, capacity) if graphs else HeadSteps(self.head, capacity)

    def runtime(self) -> dict:
        return {"draft": self.steps.summary()}

    def close(self) -> None:
        if self.steps.leased:  # the buffer and graphs go back to the head's kept ones; go on eagerly if used again
            give_back(self.steps)
            self._new_steps(graphs=False)
        else:
            self.steps.reset()
        self.known, self.root_hidden, self.root_logits = [], None, None
