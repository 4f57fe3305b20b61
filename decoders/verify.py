"""The one verification core. Every method (chain, tree, beam) decides acceptance here and nowhere else.

Paper names throughout: p = target distribution, q = draft distribution (Leviathan et al. 2023, Chen et al.
2023), r = the target residual that recursive rejection sampling (RRS) walks down.

A chain is a tree whose nodes have one child each, and Leviathan/Chen's modified rejection sampling is RRS with
one candidate: one walk serves both. Greedy (temperature 0) verification is the longest path whose every token is
the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import sample, uniform
from .tree import DraftTree, Flavor, children

_EPS = 1e-12  # below this a residual is treated as empty (unreachable in exact arithmetic)


@dataclass
class Check:
    """One draft node put to the test."""

    node: int
    accepted: bool
    accept_prob: float  # min(1, r(x) / q'(x)) under sampling; 1.0 / 0.0 under greedy
    uniform: float | None  # the U(0,1) draw compared with it (None under greedy)


@dataclass
class Verdict:
    """Outcome of one round: the accepted path and the one token the target adds after it."""

    path: list[int]  # accepted node ids in order, root excluded
    token: int  # the bonus or resampled token
    source: str  # "bonus" | "resampled" | "baseline" (no draft was offered)
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


def proposal(flavor: str, q: torch.Tensor | None, token: int, tried: list[int], vocab: int) -> torch.Tensor:
    """The distribution the candidate `token` was effectively drawn from, given the tokens already tried. (V,)"""
    if flavor == Flavor.DETERMINISTIC or q is None:
        point = torch.zeros(vocab)  # (V,)
        point[token] = 1.0
        return point
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
    vocab = p.shape[-1]
    path: list[int] = []
    checks: list[Check] = []
    node = 0
    while True:
        if not kids[node]:
            return Verdict(path, sample(p[node], generator), _bonus_source(tree, kids[node]), checks)
        r = p[node]  # (V,) current target residual at this node
        q = tree.q_dists.get(node)  # (V,) or None (deterministic drafter)
        tried: list[int] = []
        accepted_child = None
        for child in kids[node]:
            token = tree.tokens[child]
            if tree.flavor == Flavor.DETERMINISTIC and token in tried:
                continue  # a duplicate candidate carries no new mass
            q_eff = proposal(tree.flavor, q, token, tried, vocab)  # (V,)
            u = uniform(generator)
            q_x, r_x = float(q_eff[token]), float(r[token])
            ok = u * q_x < r_x  # = u < min(1, r(x)/q(x)), safe when q(x) = 0
            checks.append(Check(child, ok, min(1.0, r_x / q_x) if q_x > 0 else 1.0, u))
            if ok:
                accepted_child = child
                break
            r = residual(r, q_eff)  # (V,)
            tried.append(token)
        if accepted_child is None:
            return Verdict(path, sample(r, generator), "resampled", checks)
        path.append(accepted_child)
        node = accepted_child


def verify(tree: DraftTree, p: torch.Tensor, greedy: bool, generator: torch.Generator) -> Verdict:
    """Dispatch. p: (N+1, V) warped target distributions (one-hot rows when greedy)."""
    if greedy:
        return verify_greedy(tree, p.argmax(-1).tolist())
    return verify_sampling(tree, p, generator)


def _bonus_source(tree: DraftTree, node_children: list[int]) -> str:
    if tree.n_drafted == 0:
        return "baseline"
    return "bonus" if not node_children else "resampled"
