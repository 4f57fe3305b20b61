"""The one verification core. Every method (chain, tree, beam) decides acceptance here and nowhere else.

Paper names throughout: p = target distribution, q = draft distribution (Leviathan et al. 2023, Chen et al.
2023), r = the target residual that recursive rejection sampling (RRS) walks down.

A chain is a tree whose nodes have one child each, and Leviathan/Chen's modified rejection sampling is RRS with
one candidate: one walk serves both. Greedy (temperature 0) verification is the longest path whose every token is
the target's argmax.

Sampled verification runs on the target's device as tensor ops (`walk_on_device`: the round's uniforms in one draw,
the tests u·q'(x) < r(x), the first rejection, the residual and the token the target adds), and its outcome comes
back with the round's one host copy (decoders/readout.py), where `verdict_of_walk` turns it into the Verdict. The
seeded stream is consumed as one draw of N+1 float64 uniforms a round: node i's test uses u[i], the token u[0].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch

from .readout import RoundReadout, upload
from .tree import DraftTree, Flavor, children, depths

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
    """norm(max(r - q, 0)) per row: what is left of the target mass after a rejected candidate. (..., V) -> (..., V)"""
    left = torch.clamp(r - q, min=0.0)  # (..., V)
    total = left.sum(-1, keepdim=True)  # (..., 1)
    # numerical guard: after a rejection a row cannot be empty in exact arithmetic; an empty one keeps r
    return torch.where(total > _EPS, left / total.clamp_min(_EPS), r)  # (..., V)


def acceptance_probability(r_x: float, q_x: float) -> float:
    """P(u·q'(x) < r(x)) for u ~ U(0,1): min(1, r(x)/q'(x)); 1.0 or 0.0 by r(x) > 0 when q'(x) = 0 (see Check)."""
    if q_x > 0:
        return min(1.0, r_x / q_x)
    return 1.0 if r_x > 0 else 0.0


def acceptance_probabilities(r_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """acceptance_probability for a batch of candidates, on their device. (M,), (M,) -> (M,)"""
    return torch.where(q_x > 0, (r_x / q_x).clamp(max=1.0), (r_x > 0).to(r_x.dtype))  # (M,)


def proposal(flavor: str, q: torch.Tensor | None, token: torch.Tensor, tried: torch.Tensor | None,
             like: torch.Tensor) -> torch.Tensor:
    """The distributions the candidates `token` (M,) were effectively drawn from, given the tokens already tried
    (tried: (M, V) bool, None when nothing was tried yet). (M, V)

    q (M, V) is None only for DETERMINISTIC candidates (their point masses are built like `like`: same device,
    dtype and size).
    """
    if flavor == Flavor.DETERMINISTIC:
        return torch.zeros_like(like).scatter_(-1, token[:, None], 1.0)  # (M, V) on the target's device
    if q is None:
        raise VerificationError(f"a {flavor} candidate needs the distribution q it was drawn from; only "
                                "deterministic candidates may come without one")
    if flavor == Flavor.WITHOUT_REPLACEMENT and tried is not None:
        left = q.masked_fill(tried, 0.0)  # (M, V)
        return left / left.sum(-1, keepdim=True).clamp_min(_EPS)  # (M, V)
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
    """Lossless walk by recursive rejection sampling. p: (N+1, V) warped target distributions, row i after node i.
    The walk runs on p's device (`walk_on_device`); its numbers come back in one copy."""
    return verdict_of_walk(tree, walk_on_device(tree, p, generator).cpu().tolist())


def verify(tree: DraftTree, logits: torch.Tensor, p: torch.Tensor | None, generator: torch.Generator,
           read: RoundReadout | None = None) -> Verdict:
    """The one dispatch every method calls. logits: (N+1, V) raw target output; p: (N+1, V) the warped target, None
    at temperature 0 (greedy verification needs only the argmax of the logits, which the one-hot warp keeps).
    read: the round's one host copy (decoders/readout.py) when the caller made it: greedy walks its argmax, a sampled
    round finishes the walk the caller started on the device before the copy (`walk_on_device`)."""
    if p is None:
        return verify_greedy(tree, read.argmax if read is not None else logits.argmax(-1).tolist())
    if read is not None and read.walk is not None:
        return verdict_of_walk(tree, read.walk)
    return verify_sampling(tree, p, generator)


# ---------------------------------------------------------------- recursive rejection sampling on the device
#
# The sequential walk tested one candidate at a time, and on a GPU every test read its draw and its ratio back to
# the host (a sync per drafted node). Here the walk is tensor ops with no read until its end: the candidates of
# every node are tested at once, rank by rank (the j-th candidates of all nodes together, each against its node's
# residual after the earlier ones were rejected), as if every node were reached; which nodes the walk really
# reaches (the root, then each reached node's first accepted candidate) is decided afterwards, and only their tests
# count. Node i owns the uniform u[i], so the tests on the path see independent draws, as in the sequential walk;
# the unreached nodes' tests are computed and thrown away.


@dataclass
class _Layout:
    """The tree's shape for the device walk, built on the host (where the tree lives) and uploaded in one copy.

    The nodes with candidates ("inner", M of them) are sorted by how many they have, most first, so the nodes that
    have a j-th candidate are the first have[j] rows: every rank works on a prefix, a view."""

    inner: list[int]  # (M,) node ids, most candidates first
    have: list[int]  # (J,) have[j] = how many inner nodes have a j-th candidate
    rows: torch.Tensor  # (M,) long on the device: the inner node ids
    # (6, M, J) long, per candidate: its node id, its token, 1 = a duplicate the walk skips, its column among the
    # node's distinct tokens; per node: its distinct tokens (padded with the first), 1 = a real one (not padding)
    table: torch.Tensor
    parents: torch.Tensor  # (N+1,) long, the root's given as 0 (the root is always reached)
    row_of: torch.Tensor  # (N+1,) long: node -> its inner row, -1 for a leaf
    depth: int  # the deepest node's depth: how many hops the accepted path can make


def _layout(tree: DraftTree, kids: list[list[int]], device: torch.device) -> _Layout:
    inner = sorted((node for node, node_kids in enumerate(kids) if node_kids), key=lambda node: -len(kids[node]))
    width = max((len(kids[node]) for node in inner), default=0)
    table = [[[0] * width for _ in inner] for _ in range(6)]  # (6, M, J), planes as in _Layout.table
    row_of = [-1] * tree.size
    for m, node in enumerate(inner):
        row_of[node] = m
        distinct = list(dict.fromkeys(tree.tokens[child] for child in kids[node]))
        table[4][m] = distinct + [distinct[0]] * (width - len(distinct))
        table[5][m] = [1] * len(distinct) + [0] * (width - len(distinct))
        for j, child in enumerate(kids[node]):
            token = tree.tokens[child]
            # a duplicate deterministic candidate carries no new mass (its point mass was rejected already)
            skipped = tree.flavor == Flavor.DETERMINISTIC and token in [tree.tokens[c] for c in kids[node][:j]]
            table[0][m][j], table[1][m][j], table[2][m][j] = child, token, int(skipped)
            table[3][m][j] = distinct.index(token)
    flat = inner + [max(p, 0) for p in tree.parents] + row_of + [x for part in table for line in part for x in line]
    shape = upload(flat, device)  # the shape's one host-to-device copy, queued behind the round's forward
    m, n = len(inner), tree.size
    return _Layout(inner, [sum(len(kids[node]) > j for node in inner) for j in range(width)], shape[:m],
                   shape[m + 2 * n:].view(6, m, width), shape[m:m + n], shape[m + n:m + 2 * n],
                   max(depths(tree.parents)))


@torch.inference_mode()
def walk_on_device(tree: DraftTree, p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Recursive rejection sampling as tensor ops on p's device, without a host read. p: (N+1, V), row i after
    node i. Returns what verdict_of_walk needs, packed in one float64 vector so that it rides in the round's one copy
    (decoders/readout.py): (4N + 1,) = tested (N,) 1 where node i was put to the test on the walk, ok (N,) its
    outcome, accept_prob (N,), u (N,) its draw, then the token the target adds (bonus or resampled)."""
    kids = children(tree.parents)
    _require_draft_distributions(tree, kids)
    shape = _layout(tree, kids, p.device)
    # (N+1,): u[i] tests node i, u[0] draws the token; all of the round's randomness in one call
    u = torch.rand(tree.size, dtype=torch.float64, generator=generator, device=generator.device).to(p.device)
    r, ok, tested, prob = _test_candidates(tree.flavor, shape, tree.q_dists, p, u)
    reached = _accepted_path(shape, ok)  # (N+1,) bool
    tested &= reached.index_select(0, shape.parents)  # a test counts where the walk got to its node
    token = _draw(_end_distribution(shape, p, r, reached, tree.flavor == Flavor.DETERMINISTIC), u[0])  # (1,)
    return torch.cat([tested[1:].double(), ok[1:].double(), prob[1:], u[1:], token.double()])  # (4N + 1,)


def _test_candidates(flavor: str, shape: _Layout, q_dists: dict, p: torch.Tensor, u: torch.Tensor) -> tuple:
    """Every inner node's candidates tested in order against its running residual, rank by rank. Returns the
    residuals left after each inner node's last candidate ((M, V), or (M, J+1) narrow for deterministic candidates,
    see _narrow), and per node (N+1,): accepted (as the first of its siblings to pass), tested (if its parent is
    reached), the acceptance probability."""
    ok = torch.zeros(u.shape[0], dtype=torch.bool, device=p.device)  # (N+1,)
    tested = torch.zeros_like(ok)  # (N+1,)
    prob = torch.zeros_like(u)  # (N+1,) float64
    point = flavor == Flavor.DETERMINISTIC
    # each inner node's residual: p (or its narrow form) until a candidate is rejected; a candidate's entry in it
    r = _narrow(shape, p) if point else p.index_select(0, shape.rows)  # (M, J+1) or (M, V)
    entries = shape.table[3] if point else shape.table[1]  # (M, J) where each candidate's entry sits in r
    q = torch.stack([q_dists[n] for n in shape.inner]).to(r) if not point and shape.inner else None  # (M, V)
    tried = torch.zeros_like(r, dtype=torch.bool) if flavor == Flavor.WITHOUT_REPLACEMENT else None  # (M, V)
    settled = torch.zeros(len(shape.inner), dtype=torch.bool, device=p.device)  # (M,) a candidate passed already
    for j, c in enumerate(shape.have):  # the nodes with a j-th candidate are rows :c
        child, skipped, entry = shape.table[0, :c, j], shape.table[2, :c, j], entries[:c, j]  # (c,) each
        q_eff = proposal(flavor, None if q is None else q[:c], entry, tried[:c] if tried is not None and j else None,
                         r[:c])  # (c, V) or (c, J+1)
        r_x = r[:c].gather(1, entry[:, None])[:, 0].double()  # (c,)
        q_x = q_eff.gather(1, entry[:, None])[:, 0].double()  # (c,)
        judged = (skipped == 0) & ~settled[:c]  # (c,) tested, if the walk reaches the node
        passed = judged & (u.index_select(0, child) * q_x < r_x)  # (c,) = u < min(1, r(x)/q(x)), safe at q(x) = 0
        ok.index_copy_(0, child, passed)
        tested.index_copy_(0, child, judged)
        prob.index_copy_(0, child, acceptance_probabilities(r_x, q_x))
        settled[:c] |= passed
        r[:c] = torch.where((skipped == 0)[:, None], residual(r[:c], q_eff), r[:c])
        if tried is not None:
            tried[:c].scatter_(1, entry[:, None], True)
    return r, ok, tested, prob


def _narrow(shape: _Layout, p: torch.Tensor) -> torch.Tensor:
    """A node's residual after rejected point masses, kept narrow: rejecting a point mass zeroes one entry and scales
    every other alike, so the node's distinct candidate tokens' entries and the mass of all the rest, one entry,
    carry it exactly (the same `residual` applies), at J+1 entries a node instead of V. (M, J+1), the rest last."""
    distinct, real = shape.table[4], shape.table[5].to(p.dtype)  # (M, J) each
    candidates = p[shape.rows[:, None], distinct] * real  # (M, J), padding 0
    rest = (p.sum(-1).index_select(0, shape.rows) - candidates.sum(-1)).clamp_min(0.0)  # (M,)
    return torch.cat([candidates, rest[:, None]], dim=1)  # (M, J+1)


def _widen(shape: _Layout, p: torch.Tensor, narrow: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """Row `row` (1,) of a narrow residual as a distribution over the vocabulary: its candidate tokens' entries, and
    every other token's p scaled as the rest was. (1, V)"""
    node = shape.rows.index_select(0, row)  # (1,)
    base = p.index_select(0, node)  # (1, V)
    start = _narrow(shape, p).index_select(0, row)  # (1, J+1) p's own narrow form: the rest before any rejection
    final = narrow.index_select(0, row)  # (1, J+1)
    scale = torch.where(start[:, -1] > 0, final[:, -1] / start[:, -1].clamp_min(_EPS), 0.0)  # (1,)
    distinct, real = shape.table[4].index_select(0, row), shape.table[5].index_select(0, row) > 0  # (1, J) each
    values = torch.where(real, final[:, :-1], final[:, :1])  # (1, J) padding repeats the first token and its value
    return (base * scale[:, None]).scatter(1, distinct, values)  # (1, V)


def _accepted_path(shape: _Layout, ok: torch.Tensor) -> torch.Tensor:
    """reached[i]: the walk gets to node i (the root, then each reached node's accepted candidate). (N+1,) bool"""
    root = torch.zeros_like(ok)  # (N+1,)
    root[0] = True
    reached = root
    for _ in range(shape.depth):  # one hop a level
        reached = root | (ok & reached.index_select(0, shape.parents))  # (N+1,)
    return reached


def _end_distribution(shape: _Layout, p: torch.Tensor, r: torch.Tensor, reached: torch.Tensor,
                      point: bool) -> torch.Tensor:
    """Where the walk stops, the deepest reached node (the path's ids grow with depth), the token comes from p at a
    leaf (the bonus), or from the residual where every candidate was rejected. (V,)"""
    ids = torch.arange(reached.shape[0], device=reached.device)  # (N+1,)
    end = torch.where(reached, ids, 0).argmax().view(1)  # (1,)
    leaf = p.index_select(0, end)  # (1, V)
    if not shape.inner:
        return leaf[0]
    row = shape.row_of.index_select(0, end)  # (1,) -1 at a leaf
    inner = row.clamp_min(0)  # (1,)
    left = _widen(shape, p, r, inner) if point else r.index_select(0, inner)  # (1, V)
    return torch.where(row[:, None] >= 0, left, leaf)[0]  # (V,)


def _draw(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token from dist (V,) by inverting its CDF at u: in float64, so a token of tiny mass keeps its share, and
    the token drawn always has positive mass (u < 1, and the first cell past u·total grew the sum). (1,)"""
    cdf = dist.double().cumsum(0)  # (V,)
    return torch.searchsorted(cdf, (u * cdf[-1]).view(1), right=True).clamp_max(dist.shape[0] - 1)  # (1,)


def verdict_of_walk(tree: DraftTree, numbers: list[float]) -> Verdict:
    """The Verdict from walk_on_device's numbers on the host. The tested nodes in id order are in test order: a
    node's candidates are tried in id order, and the accepted one's children have larger ids than it."""
    n = tree.n_drafted
    tested, ok, prob, u = (numbers[k * n:(k + 1) * n] for k in range(4))
    checks = [Check(i + 1, ok[i] > 0, prob[i], u[i]) for i in range(n) if tested[i] > 0]
    path = [check.node for check in checks if check.accepted]
    end = path[-1] if path else 0
    return Verdict(path, int(numbers[4 * n]), _bonus_source(tree, children(tree.parents)[end]), checks)


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
