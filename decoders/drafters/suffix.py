"""Suffix decoding (Oliaro et al., arXiv 2411.04975; vLLM's `suffix` method): a model-free drafter that matches the
tail of the text against a suffix tree and drafts a tree of the continuations that followed it, weighted by how
often each did, as many tokens as the match is long (decoders/drafters/suffix_tree.py has the algorithm).

Two trees, as in the paper: one over this run's prompt and output, grown as tokens are committed, and one over a
store of earlier outputs (SuffixStore: the visitor's, passed in through the API; bounded, first in first out). Each
round drafts from both and sends the better-scoring tree. Candidates are chosen, not sampled, so the tree is verified
as Flavor.DETERMINISTIC (point-mass proposals): lossless at any temperature (decoders/verify.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..tree import DraftTree, Flavor
from .base import Drafter, DraftStop, Proposal
from .suffix_tree import Draft, Growing, SuffixTree

THIS_RUN, EARLIER = "this run", "earlier outputs"  # where a round's match was found (the trace's search.source)


@dataclass(frozen=True)
class Settings:
    """The paper's knobs, from DecodeOptions' suffix_* fields (their defaults are vLLM's)."""

    depth: int  # the suffix tree's depth: the longest tail matched plus what follows it
    max_tokens: int  # most draft nodes per round
    factor: float  # a match of L tokens earns at most floor(factor * L) draft nodes
    min_prob: float  # a candidate whose estimated probability is below this is not drafted


class SuffixStore:
    """Earlier outputs a visitor's suffix-decoding runs can draft from: at most `max_outputs` of them and
    `max_tokens` tokens in all, the oldest dropped first. Plain token ids (one tokenizer: keep one store per target
    model), each with the text it decoded to, so a page can show what the store holds.

    A run reads the store; it learns nothing by itself. The caller adds what it wants remembered (the app adds each
    finished Generate run; bench.suffix each turn of a conversation), so a race or a repeated timing sees the same
    store every time."""

    def __init__(self, max_outputs: int = 16, max_tokens: int = 8192):
        self.max_outputs, self.max_tokens = max_outputs, max_tokens
        self.outputs: list[tuple[tuple[int, ...], str]] = []
        self._trees: dict[int, SuffixTree] = {}  # depth -> the tree over every output, kept in step with them

    def add(self, ids: list[int], text: str = "") -> None:
        ids = tuple(int(t) for t in ids)[-self.max_tokens:]
        if not ids:
            return
        self.outputs.append((ids, text))
        for tree in self._trees.values():
            tree.add(list(ids))
        while len(self.outputs) > self.max_outputs or self.tokens > self.max_tokens:
            old, _ = self.outputs.pop(0)
            for tree in self._trees.values():
                tree.remove(list(old))

    def clear(self) -> None:
        self.outputs.clear()
        self._trees.clear()

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.outputs)

    def tree(self, depth: int) -> SuffixTree:
        """The suffix tree over every stored output at this depth (built once, then updated with the store)."""
        if depth not in self._trees:
            tree = SuffixTree(depth)
            for ids, _ in self.outputs:
                tree.add(list(ids))
            self._trees[depth] = tree
        return self._trees[depth]

    def to_dict(self) -> dict:
        """Plain data (JSON, or a forked GPU worker): from_dict rebuilds the same store."""
        return {"max_outputs": self.max_outputs, "max_tokens": self.max_tokens,
                "outputs": [{"ids": list(ids), "text": text} for ids, text in self.outputs]}

    @classmethod
    def from_dict(cls, data: dict | None) -> "SuffixStore":
        data = data or {}
        store = cls(int(data.get("max_outputs", 16)), int(data.get("max_tokens", 8192)))
        for entry in data.get("outputs", []):
            store.add(entry["ids"], entry.get("text", ""))
        return store

    def summary(self) -> dict:
        return {"outputs": len(self.outputs), "tokens": self.tokens}


class SuffixDrafter(Drafter):
    name = "suffix"
    offers_distribution = False  # candidates are chosen by count, not sampled: q is a point mass

    def __init__(self, settings: Settings, eos_ids: tuple[int, ...] = (), store: SuffixStore | None = None):
        self.settings = settings
        self.eos = frozenset(eos_ids)
        self.store = store
        self.earlier = store.tree(settings.depth) if store is not None and store.outputs else None
        self.own: Growing | None = None  # this run's prompt and output, in a tree of their own

    def start(self, ids: list[int], features=None) -> None:
        self.own = Growing(SuffixTree(self.settings.depth), ids)

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        if self.own is None:
            self.start(ids[:0])
        self.own.extend(ids[self.own.length:])  # what was committed since the last round
        tree = DraftTree.root_only(ids[-1])
        tree.flavor = Flavor.DETERMINISTIC
        if limit <= 0:
            return Proposal(tree, reason=DraftStop.BUDGET)
        draft, source = self._best(ids, limit)
        for node in draft.nodes:  # parents come before children (a child is found only once its parent is drafted)
            tree.add(node.parent + 1, node.token, None)  # no q: a point mass (its counts are in the search)
        proposal = Proposal(tree, reason=_reason(draft, limit))
        if record:
            proposal.search = self._search(draft, source, ids, proposal.reason)
        return proposal

    def _best(self, ids: list[int], limit: int) -> tuple[Draft, str]:
        s = self.settings
        found = [(self.own.tree.speculate(ids, s.max_tokens, s.factor, s.min_prob, limit, stop_after=self.eos, seen=1),
                  THIS_RUN)]  # the run's own tree holds `ids` itself: its tails' last occurrence is their own
        if self.earlier is not None:
            found.append((self.earlier.speculate(ids, s.max_tokens, s.factor, s.min_prob, limit, stop_after=self.eos),
                          EARLIER))
        return max(found, key=lambda pair: pair[0].score)  # the earlier outputs win only with a better score

    def _search(self, draft: Draft, source: str, ids: list[int], reason: DraftStop) -> dict:
        """The trace's RoundRecord.search (schema in decoders/trace.py): the pool is the drafted nodes (all sent)
        then the candidates that passed min_prob but not the cap; value = the count-estimated probability."""
        sent = len(draft.nodes)
        pool = [{"id": i, "parent": node.parent, "token": node.token, "value": node.prob, "depth": node.depth,
                 "step": node.depth, "count": node.count, "of": node.of}
                for i, node in enumerate(draft.nodes + draft.left)]
        store = self.store.summary() if self.store is not None else {"outputs": 0, "tokens": 0}
        return {"method": "suffix", "flavor": Flavor.DETERMINISTIC, "steps": max((n.depth for n in draft.nodes),
                                                                                  default=0),
                "stop": {DraftStop.LIMIT: "cap", DraftStop.RULE: "min-prob", DraftStop.NO_MATCH: "no-match",
                         DraftStop.BUDGET: "budget"}.get(reason, str(reason)),
                "pool": pool, "frontier": [], "chosen": list(range(sent)), "ddd": [],
                "source": source, "match": list(ids[len(ids) - draft.match_len:]) if draft.match_len else [],
                "match_len": draft.match_len, "cap": draft.cap, "score": draft.score,
                "factor": self.settings.factor, "min_prob": self.settings.min_prob, "store": store}

    def summary(self) -> dict:
        return {"suffix_store_outputs": len(self.store.outputs) if self.store is not None else 0}

    def close(self) -> None:
        self.own = None  # the run's own tree; the store's stays with the store


def _reason(draft: Draft, limit: int) -> DraftStop:
    """Why the tree is this size: no tail occurred; the match's cap filled; the run's remaining budget cut its
    depth; or the candidates ran out below min_prob."""
    if not draft.match_len:
        return DraftStop.NO_MATCH
    if draft.nodes and len(draft.nodes) >= draft.cap:
        return DraftStop.LIMIT
    if any(node.depth >= limit for node in draft.nodes):
        return DraftStop.BUDGET
    return DraftStop.RULE
