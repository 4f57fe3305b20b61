"""Draft-length rules on distributions of known entropy, and AdaEDL's λ update worked by hand."""
from __future__ import annotations

import math

import pytest
import torch

from decoders.options import DecodeOptions, OptionsError
from decoders.registry import build_rule
from decoders.rules import AdaEDLRule, HeuristicRule, LambdaSchedule, MaxConfidenceRule, StaticRule


def uniform_over(k: int, vocab: int = 16) -> torch.Tensor:
    """Entropy ln k nats."""
    q = torch.zeros(vocab)
    q[:k] = 1.0 / k
    return q


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16])
def test_adaedl_stop_condition_on_known_entropy(k):
    rule = AdaEDLRule(LambdaSchedule(lam=0.7, max_draft=8))
    stop, record = rule.check(2, uniform_over(k))
    assert math.isclose(record["entropy"], math.log(k), abs_tol=1e-5)
    assert math.isclose(record["bound"], 1 - math.sqrt(0.2 * math.log(k)), abs_tol=1e-5)
    assert stop == (1 - math.sqrt(0.2 * math.log(k)) < 0.7)
    # equivalent entropy cutoff (1 - λ)^2 / γ = 0.45 nats: k = 1 continues, k = 2 (ln 2 = 0.693) stops
    assert stop == (math.log(k) > 0.45)


def test_adaedl_never_stops_before_the_first_draft():
    rule = AdaEDLRule(LambdaSchedule(lam=0.99, max_draft=8))
    assert rule.check(1, uniform_over(16))[0] is False
    assert rule.check(2, uniform_over(16))[0] is True


def test_max_confidence_stop():
    rule = MaxConfidenceRule(LambdaSchedule(lam=0.4, max_draft=8))
    assert rule.check(2, uniform_over(2))[0] is False  # max q = 0.5 >= 0.4
    assert rule.check(2, uniform_over(3))[0] is True  # max q = 0.33 < 0.4
    assert rule.check(1, uniform_over(3))[0] is False


def run_schedule(keep: str, lam0: float, rounds, alpha: float) -> tuple[list[float], list[float]]:
    schedule = LambdaSchedule(lam=lam0, max_draft=4, alpha=alpha, keep=keep)
    ars, lams = [], []
    for n_acc, n_drafted in rounds:
        schedule.update(n_acc, n_drafted)
        ars.append(schedule.ar)
        lams.append(schedule.lam)
    return ars, lams


def test_lambda_update_hand_worked():
    """L_max 4, λ0 0.5, α 0.85, β1 0.5, β2 0.9, ε 0.01, AR0 = α (AdaEDL's λ update, decoders/rules.py LambdaSchedule, worked by hand)."""
    ars, lams = run_schedule("adaedl", 0.5, [(4, 4), (1, 4), (4, 4), (3, 3)], alpha=0.85)
    assert ars == pytest.approx([0.925, 0.5875, 0.79375, 0.896875])
    assert lams == pytest.approx([0.5, 0.501, 0.502, 0.501])


def test_lambda_keep_branch_separates_the_two_variants():
    """(3, 4) with AR above target: AdaEDL moves λ down (n_acc != L_max); Draft & Verify keeps it (n_drafted == L_max)."""
    rounds = [(4, 4), (4, 4), (4, 4), (3, 4)]
    ars, lams = run_schedule("adaedl", 0.5, rounds, alpha=0.85)
    assert ars == pytest.approx([0.925, 0.9625, 0.98125, 0.865625])
    assert lams[-1] == pytest.approx(0.499)
    _, dv_lams = run_schedule("dv", 0.5, rounds, alpha=0.85)
    assert dv_lams[-1] == pytest.approx(0.5)


def test_lambda_update_ignores_rounds_without_drafts_and_stays_in_unit_interval():
    schedule = LambdaSchedule(lam=0.999, max_draft=4)
    schedule.update(0, 0)
    assert schedule.lam == 0.999 and schedule.ar == 0.9
    for _ in range(500):
        schedule.update(0, 4)
    assert 0.0 <= schedule.lam <= 1.0


def test_heuristic_schedule():
    rule = HeuristicRule(current=4, max_draft=10)
    rule.update(4, 4)
    assert rule.limit() == 6  # +2 on full acceptance
    rule.update(2, 6)
    assert rule.limit() == 5  # -1 otherwise
    for _ in range(10):
        rule.update(0, rule.limit())
    assert rule.limit() == 1  # never below 1
    for _ in range(10):
        rule.update(rule.limit(), rule.limit())
    assert rule.limit() == 10  # capped
    rule.update(0, 0)
    assert rule.limit() == 10  # no evidence, no change


def test_static_and_factory():
    assert StaticRule(3).limit() == 3 and StaticRule(3).check(2, uniform_over(16))[0] is False
    def build(**fields):
        return build_rule(DecodeOptions(method="speculative", **fields))

    assert build(rule="adaedl").schedule.lam == 0.5
    assert build(rule="max-confidence").schedule.lam == 0.4
    assert build(rule="adaedl", lam=0.3, lam_keep="dv").schedule.keep == "dv"
    assert build(rule="heuristic", gamma=3, max_draft=9).limit() == 3
    with pytest.raises(OptionsError, match="unknown draft-length rule 'nope'; choose one of: static"):
        build(rule="nope")
