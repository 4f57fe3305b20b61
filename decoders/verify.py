"""The one verification core. Every method (chain, tree, beam) decides acceptance here and nowhere else.

Paper names throughout: p = target distribution, q = draft distribution (Leviathan et al. 2023, Chen et al.
2023), r = the target residual that recursive rejection sampling (RRS) walks down.

A chain is a tree whose nodes have one child each, and Leviathan/Chen's modified rejection sampling is RRS with
one candidate: one walk serves both. Greedy (temperature 0) verification is the longest path whose every token is
the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch

from .sampling import sample, uniform
from .tree import DraftTree, Flavor, children

_EPS = 1e-12  # below this a residual is treated as empty (unreachable in exact arithmetic)


class VerificationError(ValueError):
    """A draft tree that cannot be verified losslessly as given (a drafter bug); the message says what to fix."""


class Source(StrEnum):
    """Where the one token the target adds after the accepted path came from (the trace's bonus_source)."""

    BONUS = "bonus"  # drawn from p after every draft on the path was accepted
    RESAMPLED = "resampled"  # drawn from the residual norm(max(p - q, 0)) after a rejection
    BASELINE = "baseline"  # no draft was offered: a plain target step


@dataclass
class Check:
    """One draft node put to the test.

    accept_prob is the probability that the test accepts this candidate, given the candidate and the current
    residual r: under sampling the test is u·q'(x) < r(x) with u ~ U(0,1), so accept_prob = min(1, r(x) / q'(x))
    (q' = the proposal the candidate was drawn from, see `proposal`). When q'(x) = 0 the candidate lies outside the
    support of its own proposal (impossible for a genuine draw; rounding or a drafter misreporting q) and the ratio
    is undefined; the test then accepts exactly when r(x) > 0, so accept_prob is 1.0 if it was accepted and 0.0 if
    not: what happened, never a made-up certainty. Under greedy it is 1.0 / 0.0 (argmax match or not).
    """

    node: int
    accepted: bool
    accept_prob: float  # P(accept | candidate, r, q'), as defined above
    uniform: float | None  # the U(0,1) draw compared with it (None under greedy)


@dataclass
class Verdict:
    """Outcome of one round: the accepted path and the one token the target adds after it."""

    path: list[int]  # accepted node ids in order, root excluded
    token: int  # the bonus or resampled token
    source: Source
    checks: list[Check] = field(default_factory=list)  # every tested node, in test order

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(r - q, 0)): what is left of the target mass after a rejected candidate. (V,) -> (V,)"""
    left = torch.clamp(r - q, min=0.0)  # (V,)
    total = float(left.sum())
    if total <= _EPS:  # numerical guard: after a rejection this cannot be empty in exact arithmetic
        return r
    return left / total


def acceptance_probability(r_x: float, q_x: float) -> float:
    """P(u·q'(x) < r(x)) for u ~ U(0,1): min(1, r(x)/q'(x)); 1.0 or 0.0 by r(x) > 0 when q'(x) = 0 (see Check)."""
    if q_x > 0:
        return min(1.0, r_x / q_x)
    return 1.0 if r_x > 0 else 0.0


def proposal(flavor: str, q: torch.Tensor | None, token: int, tried: list[int], like: torch.Tensor) -> torch.Tensor:
    """The distribution the candidate `token` was effectively drawn from, given the tokens already tried. (V,)

    q is None only for a DETERMINISTIC node (its point mass is built like `like`: same device, dtype and size).
    """
    if flavor == Flavor.DETERMINISTIC:
        point = torch.zeros_like(like)  # (V,) on the target's device
        point[token] = 1.0
        return point
    if q is None:
        raise VerificationError(f"a {flavor} candidate needs the distribution q it was drawn from; only "
                                "deterministic candidates may come without one")
    if flavor == Flavor.WITHOUT_REPLACEMENT and tried:
        q = q.clone()  # (V,)
        q[tried] = 0.0
        return q / q.sum().clamp_min(_EPS)
    return q  # WITH_REPLACEMENT: every candidate is a fresh draw from the same q


def verify_greedy(tree: DraftTree, target_argmax: list[int]) -> Verdict:
    """Walk from the root while some child carries the target's argmax. target_argmax[i] = argmax p_i."""
    kids = children(tree.parents)
    path: list[int] = []
    checks: list[Check] = []
    node = 0
    while True:
        best = target_argmax[node]
        match = None
        for child in kids[node]:
            hit = tree.tokens[child] == best
            checks.append(Check(child, hit, 1.0 if hit else 0.0, None))
            if hit:
                match = child
                break
        if match is None:
            return Verdict(path, best, _bonus_source(tree, kids[node]), checks)
        path.append(match)
        node = match


def verify_sampling(tree: DraftTree, p: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Lossless walk by recursive rejection sampling. p: (N+1, V) warped target distributions, row i after node i."""
    kids = children(tree.parents)
    _require_draft_distributions(tree, kids)
    path: list[int] = []
    checks: list[Check] = []
    node = 0
    while True:
        if not kids[node]:
            return Verdict(path, sample(p[node], generator), _bonus_source(tree, kids[node]), checks)
        r = p[node]  # (V,) current target residual at this node
        q = tree.q_dists.get(node)  # (V,), or None for a deterministic node
        tried: list[int] = []
        accepted_child = None
        for child in kids[node]:
            token = tree.tokens[child]
            if tree.flavor == Flavor.DETERMINISTIC and token in tried:
                continue  # a duplicate candidate carries no new mass
            q_eff = proposal(tree.flavor, q, token, tried, r)  # (V,)
            u = uniform(generator)
            q_x, r_x = float(q_eff[token]), float(r[token])
            ok = u * q_x < r_x  # = u < min(1, r(x)/q(x)), safe when q(x) = 0
            checks.append(Check(child, ok, acceptance_probability(r_x, q_x), u))
            if ok:
                accepted_child = child
                break
            r = residual(r, q_eff)  # (V,)
            tried.append(token)
        if accepted_child is None:
            return Verdict(path, sample(r, generator), Source.RESAMPLED, checks)
        path.append(accepted_child)
        node = accepted_child


def verify(tree: DraftTree, logits: torch.Tensor, p: torch.Tensor | None, generator: torch.Generator,
           argmax: list[int] | None = None) -> Verdict:
    """The one dispatch every method calls. logits: (N+1, V) raw target output; p: (N+1, V) the warped target, None
    at temperature 0 (greedy verification needs only the argmax of the logits, which the one-hot warp keeps).
    argmax: the rows' argmax when the caller already read it to the host (decoders/readout.py)."""
    if p is None:
        return verify_greedy(tree, argmax if argmax is not None else logits.argmax(-1).tolist())
    return verify_sampling(tree, p, generator)


def _require_draft_distributions(tree: DraftTree, kids: list[list[int]]) -> None:
    """Refuse a sampled tree whose drafter forgot q: treating its candidates as a point mass would be silently lossy."""
    if tree.flavor == Flavor.DETERMINISTIC:
        return
    missing = [node for node, node_kids in enumerate(kids) if node_kids and node not in tree.q_dists]
    if missing:
        raise VerificationError(
            f"draft tree nodes {missing} have {tree.flavor} children but no draft distribution: a sampling drafter "
            "must store q in tree.q_dists[parent] for every node it drafts from (or mark the tree "
            "Flavor.DETERMINISTIC if its candidates were chosen, not sampled)")


def _bonus_source(tree: DraftTree, node_children: list[int]) -> Source:
    if tree.n_drafted == 0:
        return Source.BASELINE
    return Source.BONUS if not node_children else Source.RESAMPLED
