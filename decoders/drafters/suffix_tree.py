"""SuffixDecoding's data structure (Oliaro et al., arXiv 2411.04975; vLLM's `suffix` method): a suffix tree of
bounded depth over token sequences, with a count at every node, and the frequency-weighted draft tree it proposes.

A node is a token string that occurred; its count is how many times it occurred (every suffix of every stored
sequence, cut to `depth` tokens, passes through the nodes of its first tokens). Drafting after a context:

  match    the longest tail of the context (up to depth - 1 tokens) that occurred: for each tail length L = 1, 2, ...
           walk L tokens down from the root; the first L that does not occur ends the search (no longer tail can)
  weigh    a continuation c after the matched node n is estimated to follow with probability count(c) / count(n);
           a deeper node's estimate is the product down its path (so it never exceeds its parent's)
  grow     best first by that estimate, keeping nodes whose estimate is at least min_prob, until the draft holds
           cap(L) = min(max_tokens, floor(factor * L + offset)) tokens: a long match earns a large draft, a short
           one a small draft (the paper's MAX_SPEC = alpha * p, vLLM's max_spec_factor)
  choose   every tail length L gives a draft; its score is the sum of its nodes' estimates (the expected number
           of accepted tokens if the estimates were right), and the best score wins (ties: the longer match)

A tree that holds the context itself (the run's own prompt and output) holds every tail of it once more, at its
very end, with nothing after it yet: that occurrence is left out of the counts (`seen`), so a tail that never
occurred earlier ends the search and a continuation that always followed it is estimated at 1, not 1/2.

Plain nested dicts, no path compression: the paper's tree compresses paths to stay linear in memory for millions of
tokens; SpecLab's store holds a few thousand, where depth x tokens nodes is small and the code stays readable.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


class Node:
    """One token string that occurred: `count` times, followed by the tokens in `children`."""

    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] = {}

    def child(self, token: int) -> "Node":
        node = self.children.get(token)
        if node is None:
            node = self.children[token] = Node()
        return node


@dataclass
class Candidate:
    """A draft node: `token` follows draft node `parent` (-1 = the matched context), estimated to follow with
    probability `prob` (the product of count ratios down its path); `count` of the `of` times its parent string
    occurred it was followed by this token."""

    token: int
    parent: int
    prob: float
    count: int
    of: int
    depth: int
    chance: float | None = None  # calibrated chance of acceptance, where the cost controller priced the draft


@dataclass
class Draft:
    """The frequency-weighted draft tree after one tail match; `left` holds the candidates that passed min_prob but
    were not sent (past the cap, or held back by the cost controller's price: drawn as "not sent"), each with `parent`
    an index into the pool `nodes + left` (-1: the matched context)."""

    match_len: int = 0
    cap: int = 0
    nodes: list[Candidate] = field(default_factory=list)
    left: list[Candidate] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(node.prob for node in self.nodes)


class SuffixTree:
    """Suffixes of any number of sequences, each cut to `depth` tokens. Sequences are added whole (`add`), grown a
    token at a time (`Growing`), and removed whole (`remove`, for a store's eviction)."""

    def __init__(self, depth: int):
        if depth < 2:
            raise ValueError(f"a suffix tree needs a depth of at least 2 (one token to match, one to draft), got {depth}")
        self.depth = depth
        self.root = Node()

    def add(self, tokens: list[int]) -> None:
        for start in range(len(tokens)):
            self._walk(tokens[start:start + self.depth], +1)

    def remove(self, tokens: list[int]) -> None:
        for start in range(len(tokens)):
            self._walk(tokens[start:start + self.depth], -1)

    def _walk(self, piece: list[int], step: int) -> None:
        node = self.root
        node.count += step
        for token in piece:
            nxt = node.child(token)
            nxt.count += step
            if nxt.count == 0:  # nothing else passes through: drop the branch
                del node.children[token]
                return
            node = nxt

    def nodes(self) -> int:
        """How many token strings the tree holds (its size)."""
        total, todo = 0, [self.root]
        while todo:
            node = todo.pop()
            total += len(node.children)
            todo.extend(node.children.values())
        return total

    def find(self, pattern: list[int]) -> Node | None:
        node = self.root
        for token in pattern:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_tokens: int, factor: float, min_prob: float, max_depth: int,
                  offset: float = 0.0, stop_after: frozenset[int] = frozenset(), seen: int = 0) -> Draft:
        """The best-scoring draft over every tail length of `context` that occurred (see the module docstring).
        max_depth caps how deep a draft may go (the run's budget); stop_after: tokens not drafted past (an EOS);
        seen: how many of the tree's occurrences of each tail are the context's own (1 when it holds the context)."""
        best = Draft()
        for length in range(1, min(len(context), self.depth - 1) + 1):
            node = self.find(context[-length:])
            if node is None or node.count <= seen:
                break  # a longer tail contains this one, so it cannot have occurred earlier either
            cap = max(0, min(max_tokens, int(factor * length + offset + 1e-6)))
            if cap < best.score:
                continue  # every estimate is at most 1, so `cap` nodes cannot score more than the best so far
            draft = grow(node, cap, min_prob, max_depth, stop_after, seen)
            draft.match_len = length
            if draft.score >= best.score:
                best = draft
        return best


def grow(matched: Node, cap: int, min_prob: float, max_depth: int, stop_after: frozenset[int], seen: int = 0) -> Draft:
    """Best first by estimated probability from the matched node: at most `cap` nodes, each at least min_prob (the
    matched node's own `seen` occurrences, which nothing follows yet, left out of its count)."""
    draft = Draft(cap=cap)
    order = itertools.count()  # equal estimates keep the order they were found in (deterministic)
    heap: list = []

    def push(node: Node, parent: int, prob: float, depth: int, occurred: int) -> None:
        if depth >= max_depth:
            return
        for token, child in node.children.items():
            estimate = prob * (child.count / occurred)  # the ratio first: (prob * c) / o can round above prob
            if estimate >= min_prob:
                heapq.heappush(heap, (-estimate, next(order), child, Candidate(token, parent, estimate, child.count,
                                                                                occurred, depth + 1)))

    push(matched, -1, 1.0, 0, matched.count - seen)
    while heap and len(draft.nodes) < cap:
        _, _, node, candidate = heapq.heappop(heap)
        draft.nodes.append(candidate)
        if candidate.token not in stop_after:
            push(node, len(draft.nodes) - 1, candidate.prob, candidate.depth, node.count)
    draft.left = [entry[3] for entry in sorted(heap)]
    return draft


class Growing:
    """One sequence growing a token at a time inside a tree (the run's own prompt and output): the same counts as
    `tree.add(tokens)` of the whole sequence, kept up to date in `depth` steps per token. `active` holds the node
    where each of the last depth - 1 suffixes ends; a new token extends each by one and starts a new one."""

    def __init__(self, tree: SuffixTree, tokens: list[int] = ()):
        self.tree = tree
        self.length = 0
        self.active: list[Node] = []
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        self.tree.root.count += 1
        grown = []
        for node in [*self.active, self.tree.root]:
            child = node.child(token)
            child.count += 1
            grown.append(child)
        self.active = grown[-(self.tree.depth - 1):] if self.tree.depth > 1 else []
        self.length += 1
