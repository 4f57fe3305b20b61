"""Suffix decoding (Oliaro et al., arXiv 2411.04975; vLLM's `suffix` method): a model-free drafter that matches the
tail of the text against a suffix tree and drafts a tree of the continuations that followed it, weighted by how
often each did, as many tokens as the match is long (decoders/drafters/suffix_tree.py has the algorithm).

With controller "cost" (decoders/controller.py TreeCostRule) a round sends only the best prefix of its draft by
expected tokens per unit of this machine's verification cost, none when no prefix beats the plain step; the counts'
estimates are calibrated first by how often the target took a drafted step after a match of that length
(StepCalibration).

Two trees, as in the paper: one over this run's prompt and output, grown as tokens are committed, and one over a
store of earlier outputs (SuffixStore: the visitor's, passed in through the API; bounded, first in first out). Each
round drafts from both and sends the better-scoring tree. Candidates are chosen, not sampled, so the tree is verified
as Flavor.DETERMINISTIC (point-mass proposals): lossless at any temperature (decoders/verify.py).
"""
from __future__ import annotations

import bisect
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

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


MATCH_CLASSES = (1, 2, 4, 8)  # match lengths 1 | 2 | 3-4 | 5-8 | 9 and up: one calibration each
PROBE_EVERY = 8  # priced rounds that sent nothing before one sends its best node (a probe costs t(2) − t(1), ~0.15 step)


@dataclass
class StepCalibration:
    """How far to trust the counts, by how long the match is at each drafted step: a step at depth d after a match
    of L tokens continues a match of L + d - 1 tokens (if the drafts above it are accepted, they match too), and each
    class of that length learns a = decayed steps the target took ÷ decayed estimated chance of the steps tested. A
    node's calibrated chance is the product down its path of count / of × a(its class). A step is tested when the
    target reached the node above it: taken if it accepted one of the drafted children, else the round's first miss.
    Why: one occurrence reads "followed by x, p = 1"; on the bench's chat prompts the target took such a draft after
    a one- or two-token match about one time in ten (0.1 accepted a round), while ten tokens into a copied span it
    takes nearly every one. One trust for every step (a^depth) made long copies look improbable: replayed on the
    tuning prompts it sent a fifth less on code editing than the counts alone. The priors rise with the length (0.5
    for one token to 0.9 past eight): with one prior of 0.7, a copy eight tokens in priced its ninth step and on at
    0.7 each until that class had been tested, and sent 7 drafts of 16 that were all accepted (the multi-turn set).
    The memory is about ten tested steps per class (decay 0.9), as AcceptanceEstimate's (decoders/controller.py)."""

    priors: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)  # one per class of MATCH_CLASSES, the last for 9 and up
    strength: float = 2.0
    decay: float = 0.9
    taken: list[float] = field(default_factory=list)
    expected: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.taken = [prior * self.strength for prior in self.priors]
        self.expected = [self.strength] * len(self.priors)

    @staticmethod
    def klass(match_len: int) -> int:
        return bisect.bisect_left(MATCH_CLASSES, match_len)

    def rate(self, match_len: int) -> float:
        """a for a step that continues a match of match_len tokens."""
        k = self.klass(match_len)
        return min(1.0, max(0.01, self.taken[k] / self.expected[k]))

    def chances(self, draft: Draft) -> list[float]:
        """Each drafted node's calibrated chance of acceptance (parents come before children in draft.nodes)."""
        out: list[float] = []
        for node in draft.nodes:
            above = out[node.parent] if node.parent >= 0 else 1.0
            # min(): (above * 3) / 3 can round above `above`, and a child sorted before its parent breaks the tree
            out.append(min(above, above * (node.count / node.of) * self.rate(draft.match_len + node.depth - 1)))
        return out

    def observe(self, draft: Draft, path: list[int]) -> None:
        """Learn from a verified round: `path` holds the accepted draft indices in order (the tree's node ids - 1)."""
        parent = -1
        for depth in range(1, len(path) + 2):
            kids = [node for node in draft.nodes if node.parent == parent]
            if not kids:
                return
            k, taken = self.klass(draft.match_len + depth - 1), depth <= len(path)
            self.taken[k] = self.decay * self.taken[k] + taken
            self.expected[k] = self.decay * self.expected[k] + min(1.0, sum(node.count / node.of for node in kids))
            if not taken:
                return
            parent = path[depth - 1]


class SuffixStore:
    """Earlier outputs a visitor's suffix-decoding runs can draft from: at most `max_outputs` of them and
    `max_tokens` tokens in all, the oldest dropped first. Plain token ids (one tokenizer: keep one store per target
    model), each with the text it decoded to, so a page can show what the store holds.

    A run reads the store; it learns nothing by itself. The caller adds what it wants remembered (the app adds each
    finished Generate run; bench.suffix each turn of a conversation), so a race or a repeated timing sees the same
    store every time.

    Thread-safe: API callers may share one store between threads, one adding an output while another's run drafts
    from it. Every change and every search of its trees happens under the store's lock (`reading()`: a search walks
    the trees' dicts, which an add mid-walk would change under it: "dictionary changed size during iteration"), and
    `outputs` is replaced on a change, never changed in place, so a list a reader holds stays as it was."""

    def __init__(self, max_outputs: int = 16, max_tokens: int = 8192):
        self.max_outputs, self.max_tokens = max_outputs, max_tokens
        self.outputs: list[tuple[tuple[int, ...], str]] = []  # replaced on each change (copy on write)
        self._trees: dict[int, SuffixTree] = {}  # depth -> the tree over every output, kept in step with them
        self._lock = threading.RLock()

    def add(self, ids: list[int], text: str = "") -> None:
        ids = tuple(int(t) for t in ids)[-self.max_tokens:]
        if not ids:
            return
        with self._lock:
            outputs = self.outputs + [(ids, text)]
            for tree in self._trees.values():
                tree.add(list(ids))
            while len(outputs) > self.max_outputs or sum(len(kept) for kept, _ in outputs) > self.max_tokens:
                old, _ = outputs.pop(0)
                for tree in self._trees.values():
                    tree.remove(list(old))
            self.outputs = outputs

    def clear(self) -> None:
        with self._lock:
            self.outputs = []
            self._trees = {}

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.outputs)

    def tree(self, depth: int) -> SuffixTree:
        """The suffix tree over every stored output at this depth (built once, then updated with the store). Search
        it inside `reading()`: an add from another thread changes it."""
        with self._lock:
            if depth not in self._trees:
                tree = SuffixTree(depth)
                for ids, _ in self.outputs:
                    tree.add(list(ids))
                self._trees[depth] = tree
            return self._trees[depth]

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the store still while a run searches one of its trees (no add or clear meanwhile)."""
        with self._lock:
            yield

    def to_dict(self) -> dict:
        """Plain data (JSON, or a forked GPU worker): from_dict rebuilds the same store."""
        outputs = self.outputs  # one consistent list: a change replaces it
        return {"max_outputs": self.max_outputs, "max_tokens": self.max_tokens,
                "outputs": [{"ids": list(ids), "text": text} for ids, text in outputs]}

    @classmethod
    def from_dict(cls, data: dict | None) -> "SuffixStore":
        data = data or {}
        store = cls(int(data.get("max_outputs", 16)), int(data.get("max_tokens", 8192)))
        for entry in data.get("outputs", []):
            store.add(entry["ids"], entry.get("text", ""))
        return store

    def summary(self) -> dict:
        outputs = self.outputs
        return {"outputs": len(outputs), "tokens": sum(len(ids) for ids, _ in outputs)}

    def __getstate__(self) -> dict:  # a copy (a page's session state is deep-copied) gets a lock of its own
        with self._lock:
            state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


class SuffixDrafter(Drafter):
    name = "suffix"
    offers_distribution = False  # candidates are chosen by count, not sampled: q is a point mass

    def __init__(self, settings: Settings, eos_ids: tuple[int, ...] = (), store: SuffixStore | None = None):
        self.settings = settings
        self.eos = frozenset(eos_ids)
        self.store = store
        self.earlier = store.tree(settings.depth) if store is not None and store.outputs else None
        self.own: Growing | None = None  # this run's prompt and output, in a tree of their own
        self.calibration = StepCalibration()  # how far the counts are trusted (controller "cost" prices with it)
        self.sent = Draft()  # the last round's draft as sent, for observe()
        self.idle = 0  # rounds in a row the price held back a whole draft (a probe every PROBE_EVERY)

    def start(self, ids: list[int], features=None) -> None:
        self.own = Growing(SuffixTree(self.settings.depth), ids)
        self.calibration, self.sent, self.idle = StepCalibration(), Draft(), 0

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        if self.own is None:
            self.start(ids[:0])
        self.own.extend(ids[self.own.length:])  # what was committed since the last round
        tree = DraftTree.root_only(ids[-1])
        tree.flavor = Flavor.DETERMINISTIC
        self.sent = Draft()  # what observe() learns from: nothing, unless this round sends a draft
        if limit <= 0:
            return Proposal(tree, reason=DraftStop.BUDGET)
        draft, source = self._best(ids, limit)
        priced = self._price(draft, rule)
        self.sent = draft
        for node in draft.nodes:  # parents come before children (a child is found only once its parent is drafted)
            tree.add(node.parent + 1, node.token, None)  # no q: a point mass (its counts are in the search)
        proposal = Proposal(tree, reason=DraftStop.RULE if priced else _reason(draft, limit))
        if record:
            proposal.search = self._search(draft, source, ids, "cost" if priced else proposal.reason)
        return proposal

    def observe(self, n_before, n_accepted, path=None, features=None) -> None:
        self.calibration.observe(self.sent, [node - 1 for node in (path or [])[:n_accepted]])

    def _price(self, draft: Draft, rule) -> bool:
        """Controller "cost": send the prefix of the draft, best first by calibrated chance, that the rule finds
        worth most tokens per unit of verification cost (TreeCostRule.tree_size; a suffix draft costs no forward, so
        sending nothing is the plain step). Returns whether nodes were held back: they join draft.left.

        A class of match lengths whose trust fell until nothing was sent would never be tested again, so after
        PROBE_EVERY rounds in a row that sent nothing the best node goes anyway (a probe, as the chain controller's)."""
        if rule is None or not rule.prices_trees or not draft.nodes:
            return False
        _best_first(draft, self.calibration.chances(draft))  # a child is less likely than its parent: prefixes: trees
        keep = rule.tree_size([node.chance for node in draft.nodes], 0, len(draft.nodes), least=0)
        self.idle = self.idle + 1 if keep == 0 else 0
        if self.idle >= PROBE_EVERY:
            keep, self.idle = rule.probe(draft.nodes[0].chance), 0
        if keep >= len(draft.nodes):
            return False
        draft.left = draft.nodes[keep:] + draft.left  # parent indices into the pool stay valid
        draft.nodes = draft.nodes[:keep]
        return True

    def _best(self, ids: list[int], limit: int) -> tuple[Draft, str]:
        s = self.settings
        found = [(self.own.tree.speculate(ids, s.max_tokens, s.factor, s.min_prob, limit, stop_after=self.eos, seen=1),
                  THIS_RUN)]  # the run's own tree holds `ids` itself: its tails' last occurrence is their own
        if self.earlier is not None:
            with self.store.reading():  # another thread may add to the store meanwhile
                found.append((self.earlier.speculate(ids, s.max_tokens, s.factor, s.min_prob, limit,
                                                     stop_after=self.eos), EARLIER))
        return max(found, key=lambda pair: pair[0].score)  # the earlier outputs win only with a better score

    def _search(self, draft: Draft, source: str, ids: list[int], reason: DraftStop | str) -> dict:
        """The trace's RoundRecord.search (schema in decoders/trace.py): the pool is the sent nodes, then those the
        price held back (controller "cost"), then the candidates that passed min_prob but not the cap; value = the
        count-estimated probability, chance = the calibrated one (priced nodes only)."""
        sent = len(draft.nodes)
        pool = [{"id": i, "parent": node.parent, "token": node.token, "value": node.prob, "depth": node.depth,
                 "step": node.depth, "count": node.count, "of": node.of,
                 "chance": node.chance}
                for i, node in enumerate(draft.nodes + draft.left)]
        store = self.store.summary() if self.store is not None else {"outputs": 0, "tokens": 0}
        return {"method": "suffix", "flavor": Flavor.DETERMINISTIC, "steps": max((n.depth for n in draft.nodes),
                                                                                  default=0),
                "stop": {DraftStop.LIMIT: "cap", DraftStop.RULE: "min-prob", DraftStop.NO_MATCH: "no-match",
                         DraftStop.BUDGET: "budget", "cost": "cost"}.get(reason, str(reason)),
                "pool": pool, "frontier": [], "chosen": list(range(sent)), "ddd": [],
                "source": source, "match": list(ids[len(ids) - draft.match_len:]) if draft.match_len else [],
                "match_len": draft.match_len, "cap": draft.cap, "score": draft.score,
                "factor": self.settings.factor, "min_prob": self.settings.min_prob, "store": store,
                "trust": self.calibration.rate(draft.match_len) if draft.match_len else None}

    def summary(self) -> dict:
        return {"suffix_store_outputs": len(self.store.outputs) if self.store is not None else 0}

    def close(self) -> None:
        self.own = None  # the run's own tree; the store's stays with the store


def _best_first(draft: Draft, chances: list[float]) -> None:
    """Reorder draft.nodes (and remap every parent index, draft.left's too) by calibrated chance, best first, and
    note each node's chance; ties keep the count order, in which parents come first."""
    order = sorted(range(len(draft.nodes)), key=lambda i: -chances[i])
    where = {old: new for new, old in enumerate(order)}
    nodes = [draft.nodes[i] for i in order]
    for node, i in zip(nodes, order):
        node.chance = chances[i]
    for node in nodes + draft.left:
        if node.parent >= 0:
            node.parent = where[node.parent]
    draft.nodes = nodes


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
