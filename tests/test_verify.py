"""The verification core: forced outcomes on hand-made distributions, and losslessness in distribution.

Statistical bound used throughout: with N draws from p over V tokens, each empirical frequency has standard
error s_i = sqrt(p_i (1 - p_i) / N) and E[TV] is about 0.4 * sum(s_i); we require TV < 1.5 * sum(s_i)
(about 3.75 times the expected value). The draws are seeded, so the tests are deterministic.
"""
from __future__ import annotations

import math

import pytest
import torch

from decoders import verify as core
from decoders.sampling import sample
from decoders.tree import DraftTree, Flavor

V = 8
N = 12000


def dist(values) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


P = dist([0.30, 0.05, 0.20, 0.02, 0.15, 0.08, 0.12, 0.08])
Q = dist([0.02, 0.40, 0.05, 0.25, 0.03, 0.10, 0.05, 0.10])  # far from P, so a wrong residual shows


def tolerance(p: torch.Tensor, n: int) -> float:
    return 1.5 * float(torch.sqrt(p * (1 - p) / n).sum())


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def star_tree(root: int, candidates: list[int], flavor: str, q: torch.Tensor | None) -> DraftTree:
    """Root with one child per candidate (the siblings RRS walks), each a leaf."""
    tree = DraftTree.root_only(root)
    tree.flavor = flavor
    for token in candidates:
        tree.add(0, token, float(q[token]) if q is not None else None)
    if q is not None:
        tree.q_dists[0] = q
    return tree


def draw_candidates(flavor: str, q: torch.Tensor, k: int, g: torch.Generator) -> list[int]:
    if flavor == Flavor.WITH_REPLACEMENT:
        return [sample(q, g) for _ in range(k)]
    if flavor == Flavor.WITHOUT_REPLACEMENT:
        return torch.multinomial(q, k, replacement=False, generator=g).tolist()
    return torch.topk(q, k).indices.tolist()  # deterministic: the draft's top-k


def emitted_distribution(flavor: str, k: int, n: int = N, seed: int = 0, candidates=None) -> torch.Tensor:
    """Counts of the first emitted token (accepted candidate, or the resampled one) over n trials."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    for _ in range(n):
        cands = candidates if candidates is not None else draw_candidates(flavor, Q, k, g)
        tree = star_tree(0, cands, flavor, None if flavor == Flavor.DETERMINISTIC else Q)
        p_rows = P.expand(tree.size, V)  # (N+1, V): every row is P; only row 0 matters for the first token
        verdict = core.verify_sampling(tree, p_rows, g)
        first = tree.tokens[verdict.path[0]] if verdict.path else verdict.token
        counts[first] += 1
    return counts


# ---------------------------------------------------------------- forced outcomes (hand-made distributions)

def test_greedy_walk_takes_longest_matching_path():
    tree = DraftTree.root_only(9)
    a = tree.add(0, 1)  # node 1
    tree.add(0, 2)  # node 2, sibling
    tree.add(a, 3)  # node 3 under node 1
    tree.add(a, 4)  # node 4 under node 1
    argmax = [1, 4, 0, 0, 6]  # root -> 1 (node 1), after node 1 -> 4 (node 4), after node 4 -> 6
    verdict = core.verify_greedy(tree, argmax)
    assert verdict.path == [1, 4]
    assert (verdict.token, verdict.source) == (6, "bonus")
    assert [(c.node, c.accepted) for c in verdict.checks] == [(1, True), (3, False), (4, True)]


def test_greedy_rejection_emits_target_argmax():
    tree = star_tree(0, [5], Flavor.WITH_REPLACEMENT, None)
    verdict = core.verify_greedy(tree, [2, 0])
    assert verdict.path == [] and (verdict.token, verdict.source) == (2, "resampled")


def test_sampling_forced_accept_and_forced_reject():
    g = torch.Generator().manual_seed(0)
    q = dist([0, 1, 0, 0, 0, 0, 0, 0])
    sure = dist([0, 1, 0, 0, 0, 0, 0, 0])  # p(1) = 1 >= q(1): always accepted
    never = dist([0, 0, 1, 0, 0, 0, 0, 0])  # p(1) = 0: always rejected, residual is p itself -> token 2
    for _ in range(50):
        tree = star_tree(0, [1], Flavor.WITH_REPLACEMENT, q)
        ok = core.verify_sampling(tree, torch.stack([sure, P]), g)
        assert ok.path == [1] and ok.checks[0].accept_prob == 1.0 and ok.source == "bonus"
        bad = core.verify_sampling(tree, torch.stack([never, P]), g)
        assert bad.path == [] and bad.token == 2 and bad.source == "resampled" and bad.checks[0].accept_prob == 0.0


def test_all_accepted_bonus_comes_from_the_last_row():
    g = torch.Generator().manual_seed(0)
    tree = DraftTree.root_only(0)
    tree.flavor = Flavor.DETERMINISTIC
    tree.add(0, 3)
    p = torch.stack([dist([0, 0, 0, 1, 0, 0, 0, 0]), dist([0, 0, 0, 0, 0, 0, 0, 1])])  # accept 3, then bonus = 7
    verdict = core.verify_sampling(tree, p, g)
    assert verdict.path == [1] and (verdict.token, verdict.source) == (7, "bonus")


def test_empty_draft_is_a_baseline_step():
    verdict = core.verify_greedy(DraftTree.root_only(4), [6])
    assert verdict.path == [] and (verdict.token, verdict.source) == (6, "baseline")


def test_residual_is_normalised_positive_part():
    r = core.residual(P, Q)
    expected = torch.clamp(P - Q, min=0)
    assert torch.allclose(r, expected / expected.sum())


# ---------------------------------------------------------------- losslessness in distribution

CASES = [
    ("chain (Leviathan/Chen)", Flavor.WITH_REPLACEMENT, 1),
    ("RRS with replacement", Flavor.WITH_REPLACEMENT, 3),
    ("RRS without replacement", Flavor.WITHOUT_REPLACEMENT, 3),
    ("RRS deterministic top-k", Flavor.DETERMINISTIC, 3),
]


@pytest.mark.parametrize("name,flavor,k", CASES, ids=[c[0] for c in CASES])
def test_emitted_token_is_distributed_as_p(name, flavor, k):
    counts = emitted_distribution(flavor, k)
    assert tv(counts, P) < tolerance(P, N), f"{name}: TV {tv(counts, P):.4f} >= {tolerance(P, N):.4f}"


def test_deterministic_rrs_over_whole_vocabulary_is_distributed_as_p():
    order = [3, 1, 5, 7, 0, 2, 6, 4]
    counts = emitted_distribution(Flavor.DETERMINISTIC, V, candidates=order)
    assert tv(counts, P) < tolerance(P, N)


@pytest.mark.parametrize("name,flavor,k", CASES, ids=[c[0] for c in CASES])
def test_wrong_residual_is_caught(monkeypatch, name, flavor, k):
    """Mutation: resampling from p instead of norm(max(p - q, 0)) must fail the same bound."""
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    counts = emitted_distribution(flavor, k, n=N)
    assert tv(counts, P) > tolerance(P, N), f"{name}: the mutated residual went unnoticed (TV {tv(counts, P):.4f})"


def test_acceptance_probability_matches_min_one_ratio():
    g = torch.Generator().manual_seed(3)
    for token in range(V):
        tree = star_tree(0, [token], Flavor.WITH_REPLACEMENT, Q)
        check = core.verify_sampling(tree, torch.stack([P, P]), g).checks[0]
        assert math.isclose(check.accept_prob, min(1.0, float(P[token] / Q[token])), rel_tol=1e-6)
        assert 0.0 <= check.uniform < 1.0
