"""EAGLE-2 / DDD trees grown by an EAGLE draft head (decoders/eagle/head.py, or EAGLE-3's head3.py) instead of a
draft model.

The head reads pairs (f_i, t_{i+1}): the target's feature at position i and the token after it, and returns g_i,
its guess of f_{i+1}, with logits for t_{i+2}. Committed pairs use the target's real features, which the loop hands
over from the same forward that verified the tree (observe(features=...)): no second target forward. Inside a
draft tree a node's pair is (its parent's guessed feature, its token), so one head forward over the frontier, with a
tree mask over the head's own cache, expands the whole frontier: the same engine as the draft-model tree
(tree_draft.grow), only the scorer differs.
"""
from __future__ import annotations

import torch

from ..runtime import cache as kv
from ..eagle.head import EagleHead
from ..eagle.head3 import Eagle3Head
from .base import Drafter, DraftStop, Proposal
from .device_tree import Frontier
from .tree_draft import TreeShape, draft_log_probs, grow, growth_width, pricing_test, tree_proposal
from ..tree import DraftTree


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
        self.capacity: int | None = None  # slots of a static buffer (use_kv); None: a DynamicCache
        self.cache = kv.new_cache(head)
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
        if features is not None:
            rows = [0] + list(path or [])[:n_accepted]
            self.known.extend(features[rows])  # (n_accepted + 1, d) as rows

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        self._catch_up(ids)
        if self.root_logits is None:  # no feature known yet (a one-token prompt): one plain target step first
            return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.NONE)
        if limit <= 0:
            return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.BUDGET)
        context = kv.length(self.cache)  # committed pairs; draft pairs go after them and are dropped after
        last = [self.root_hidden[None]]  # (rows, d) the previous forward's guessed features (first: the root's)

        def expand(frontier: Frontier) -> torch.Tensor:
            # each node's pair: (its parent's guessed feature, its token); the root's children read the root's guess
            feats = last[0][frontier.rows]  # (F, d)
            hidden, logits = self._frontier_forward(frontier, feats[None], context)  # (F, d), (F, V|N)
            last[0] = hidden
            return self._full_vocab(draft_log_probs(logits, warp))  # (F, V)

        growth = grow(self._full_vocab(draft_log_probs(self.root_logits, warp)), expand, self.shape, limit,
                      pricing_test(rule))
        self.peak_bytes = max(self.peak_bytes, kv.bytes_held(self.cache))  # the whole tree's pairs are cached now
        kv.drop_last(self.cache, kv.length(self.cache) - context)  # keep committed pairs only
        return tree_proposal(self.name, ids[-1], growth, self.shape.m, record, rule)

    @torch.inference_mode()
    def _catch_up(self, ids: list[int]) -> None:
        """Feed every committed pair (f_i, t_{i+1}) whose feature is known; the last output is the root's."""
        fed = kv.length(self.cache)
        n = min(len(self.known), len(ids) - 1 - fed)  # pairs up to i = len(ids) - 2 (t_{i+1} = the pending token)
        if n <= 0:
            return
        feats = torch.stack(self.known[:n]).to(self.device)[None]  # (1, n, d)
        tokens = torch.tensor([ids[fed + 1: fed + 1 + n]], device=self.device)  # (1, n)
        hidden, logits = self.head(tokens, feats, cache=self.cache)  # (1, n, d), (1, n, V|N)
        self.known = self.known[n:]
        self.root_hidden, self.root_logits = hidden[0, -1], logits[0, -1]  # (d,), (V|N,)

    @torch.inference_mode()
    def _frontier_forward(self, frontier: Frontier, feats: torch.Tensor, context: int):
        """One head forward over the frontier; each pair sees the committed pairs and its ancestors' pairs."""
        mask = frontier.mask(context, feats.dtype)  # (F, L+F), L = context + the slots fed this round
        positions = torch.full((1, frontier.size), context - 1 + frontier.depth, device=self.device)  # (1, F)
        hidden, logits = self.head(frontier.tokens[None], feats, position_ids=positions, cache=self.cache,
                                   attention_mask=mask[None, None])  # (1, F, d), (1, F, V|N)
        return hidden[0], logits[0]  # (F, d), (F, V|N)

    def _full_vocab(self, logq: torch.Tensor) -> torch.Tensor:
        """Reduced-vocabulary log-probs (…, N) scattered to target ids (…, V), -inf elsewhere."""
        if self.head.vocab_ids is None:
            return logq
        full = torch.full((*logq.shape[:-1], self.head.config.vocab_size), -torch.inf, dtype=logq.dtype,
                          device=logq.device)  # (…, V)
        full[..., self.head.vocab_ids] = logq
        return full

    def kv_peak_bytes(self) -> int:
        return self.peak_bytes

    def use_kv(self, plan) -> None:
        """A static plan gives the head a buffer too, read as views (its forwards run by hand, eagerly)."""
        self.capacity = plan.capacity(growth_width(self.shape)) if plan.static else None
        self.cache = kv.new_cache(self.head, self.capacity)

    def close(self) -> None:
        self.cache = kv.new_cache(self.head, self.capacity)
        self.known, self.root_hidden, self.root_logits = [], None, None
