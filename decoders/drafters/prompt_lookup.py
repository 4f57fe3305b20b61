"""Prompt lookup (Saxena 2023): copy what followed an earlier occurrence of the last n tokens.

Candidates are chosen, not sampled, so verification treats q as a point mass (Flavor.DETERMINISTIC): under
sampling a copied token is accepted with probability p(token), and the residual is p with that token removed.
Like transformers (and vLLM's n-gram proposer, which also sets a shortest n: min_ngram), the longest matching tail
wins, its first occurrence from the left, and proposals stop after an end-of-sequence token.
"""
from __future__ import annotations

from ..tree import DraftTree, Flavor
from .base import Drafter, DraftStop, Proposal


def lookup(ids: list[int], max_ngram: int, limit: int, min_ngram: int = 1) -> list[int]:
    """Up to `limit` tokens that followed the first earlier occurrence of the longest matching tail n-gram (of
    min_ngram to max_ngram tokens)."""
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        tail = ids[-n:]
        for start in range(len(ids) - n):  # excludes the tail itself
            if ids[start:start + n] == tail:
                return ids[start + n:start + n + limit]
    return []


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"
    offers_distribution = False

    def __init__(self, max_ngram: int = 3, eos_ids: tuple[int, ...] = (), min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.eos_ids = set(eos_ids)

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        tree = DraftTree.root_only(ids[-1])
        tree.flavor = Flavor.DETERMINISTIC
        if limit <= 0:
            return Proposal(tree, reason=DraftStop.BUDGET)
        copied = lookup(ids, self.max_ngram, limit, self.min_ngram)
        for token in copied:
            tree.add(tree.size - 1, token, None)
            if token in self.eos_ids:
                return Proposal(tree, reason=DraftStop.EOS)
        return Proposal(tree, reason=DraftStop.LIMIT if copied else DraftStop.NO_MATCH)
