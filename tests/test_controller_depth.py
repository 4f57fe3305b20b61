"""The draft controller's acceptance by depth (decoders/controller.py): α_k learnt per class of depths, shrunk toward
the class above, and the gain curve it feeds (with one α for every depth, Leviathan's)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.figures.rule import controller_sentence
from decoders.controller import AcceptanceEstimate, CostAwareRule, PositionRate, gain_curve
from decoders.rules import StaticRule
from decoders.stats import expected_tokens


def test_acceptance_by_depth_learns_that_a_draft_that_survives_its_start_is_taken():
    """Code: a round either misses at its first token or copies the whole line. The per-depth chances see that;
    one geometric α (about 0.5 here) would price depth 8 at 0.5^8."""
    estimate = AcceptanceEstimate()
    assert estimate.rates(6) == pytest.approx([estimate.alpha] * 6)  # nothing seen: Leviathan's model
    for _ in range(10):
        estimate.update(0, 8)
        estimate.update(8, 8)
    rates = estimate.rates(12)
    assert rates[0] < 0.65 and min(rates[1:8]) > 0.85  # depth 1 is the gamble; the rest follow it
    assert rates[8:] == pytest.approx([rates[7]] * 4)  # depths 9-12 never tested: what depth 8 reads


def test_the_gain_curve_with_one_alpha_per_depth_is_leviathan_s():
    t = lambda n: 1 + 0.1 * (n - 1)
    assert gain_curve([0.8] * 16, 0.1, t, 16) == pytest.approx(gain_curve(0.8, 0.1, t, 16))
    assert gain_curve(0.8, 0.1, t, 16)[4] == pytest.approx(expected_tokens(0.8, 4) / (4 * 0.1 + t(5)))


def test_bursty_acceptance_earns_a_longer_cap_than_the_geometric_model():
    t = lambda n: 1 + 0.07 * (n - 1)  # about Qwen2.5-Coder-1.5B's packed float32 chain curve on the 2-core CPU
    bursty = CostAwareRule(StaticRule(4), t=t, c=0.2)
    for _ in range(6):
        for accepted in (1, 8, 8, 0):
            bursty.limit()
            bursty.update(accepted, 8)
    geometric = gain_curve(bursty.estimate.alpha, 0.2, t, 32)
    geometric_cap = max(range(33), key=geometric.__getitem__)
    assert bursty.limit() >= geometric_cap + 3 and bursty.last["by_depth"][0] < bursty.last["by_depth"][3]


def test_an_old_miss_at_a_depth_the_caps_no_longer_reach_fades_and_the_cap_tries_it_again():
    """The first long round misses at depth 7; from then on the target takes every round whole. Depth 7's class is
    not tested while the caps stay at 6, so only aging can bring the cap back (without it: 6 for all 12 rounds)."""
    t = lambda n: 1 + 0.07 * (n - 1)
    rule = CostAwareRule(StaticRule(16), t=t, c=0.2)
    rule.limit()
    rule.update(6, 8)
    caps = []
    for _ in range(12):
        caps.append(rule.limit())
        rule.update(caps[-1], caps[-1])
    assert caps[0] <= 6 and max(caps[:4]) > 6 and caps[-1] > 16  # held below the miss, then tried again and grown


def test_classes_a_round_never_reaches_age_by_the_rounds_weight():
    estimate = AcceptanceEstimate()
    estimate.update(6, 8)  # tested depths 1..7: a miss at 7
    deep = estimate.by_depth[5]  # depths 7-8
    before = (deep.accepted, deep.tested)
    estimate.update(2, 2)  # tests depths 1-2 only
    assert (deep.accepted, deep.tested) == pytest.approx((before[0] * 0.9 ** 2, before[1] * 0.9 ** 2))
    shallow = estimate.by_depth[0]
    estimate.update(0, 3)  # depth 1 tested (a miss): it decays once, by its own test
    assert shallow.tested == pytest.approx(0.9 * (0.9 * 1 + 1) + 1)


class Judging(StaticRule):
    """An inner rule that judges each position (like AdaEDL): sure where `sure(position)`, doubtful elsewhere."""

    name = "adaedl"
    needs_distribution = True

    def __init__(self, sure):
        super().__init__(8)
        self.sure = sure

    def decide(self, position, values):  # the verdict seam (rules.DraftRule.decide)
        bound = 0.9 if self.sure(position) else 0.3
        stop = position > 1 and bound < 0.5
        return stop, {"position": position, "bound": bound, "lam": 0.5, "stop": stop}


def test_past_the_cap_a_sure_position_that_pays_is_drafted_and_a_doubtful_one_stops_the_round():
    """Rounds that end at their cap with the draft sure of the next token (the cross-tokenizer code runs): the cap is
    the plan, the rule's confidence carries the round past it; doubt past the cap ends the round."""
    t = lambda n: 1 + 0.07 * (n - 1)
    sure_up_to = [32]
    rule = CostAwareRule(Judging(lambda position: position <= sure_up_to[0]), t=t, c=0.2,
                         estimate=AcceptanceEstimate(prior=0.6))  # on average drafts are taken 60%: a short plan
    rule.sure = PositionRate(prior=0.97)  # but the positions the rule was sure of were taken 97%
    bound, cap = rule.limit(), rule.last["cap"]
    assert bound == 32 and cap < 16  # the drafter may go on; the plan is shorter
    sure_up_to[0] = cap + 2
    for position in range(1, cap + 1):
        assert rule.check(position, None)[0] is False
    for position in (cap + 1, cap + 2):
        stop, record = rule.check(position, None)
        assert stop is False and record["past_cap"] and record["worth"] > record["price"]
    stop, record = rule.check(cap + 3, None)  # doubtful past the cap: the round ends whatever it would be worth
    assert stop is True and record["past_cap"]
    assert rule.update(cap + 2, cap + 2)["controller"]["extended"] == 2


def test_a_sure_position_is_priced_at_its_depth_s_alpha_when_that_is_higher_than_a_sure():
    """Code editing: lines' first tokens are missed (a_sure low) while a round that survives its start copies the
    line (α at depth 5-8 high). A sure position past the cap is worth its depth's α, not the one rate of every
    depth; with a_sure alone (0.55^k) the round below would stop at the cap."""
    t = lambda n: 1 + 0.07 * (n - 1)
    estimate = AcceptanceEstimate(prior=0.6)
    for _ in range(3):
        estimate.update(0, 1)  # first tokens missed
        estimate.update(8, 8)  # or whole lines taken
    rule = CostAwareRule(Judging(lambda position: True), t=t, c=0.2, estimate=estimate)
    rule.sure = PositionRate(prior=0.55)
    bound, cap = rule.limit(), rule.last["cap"]
    assert bound == 32 and 0 < cap < 32
    for position in range(1, cap + 1):
        assert rule.check(position, None)[0] is False
    stop, record = rule.check(cap + 1, None)
    assert stop is False and record["past_cap"] and record["worth"] > record["price"]
    rates = rule.last["by_depth"]
    assert record["worth"] > 0.55 ** (cap + 1) * (1 + rates[cap + 1]) * 1.5  # well above what a_sure alone gives


def test_without_a_rule_that_judges_positions_the_cap_is_the_bound():
    rule = CostAwareRule(StaticRule(8), t=lambda n: 1 + 0.07 * (n - 1), c=0.2)
    assert rule.limit() == rule.last["cap"]  # prompt lookup and static γ: nothing to judge past the cap
    off = CostAwareRule(Judging(lambda position: True), t=lambda n: 1 + 0.07 * (n - 1), c=0.2, extend=False)
    assert off.limit() == off.last["cap"]


def test_the_round_s_sentence_says_how_many_positions_went_past_the_cap():
    decision = {"cap": 3, "gain": [1.0, 1.2, 1.3, 1.35, 1.3], "extended": 4, "overruled": 0}
    sentence = controller_sentence(SimpleNamespace(rule={"controller": decision}, n_drafted=7))
    assert "drafted 7" in sentence and "4 past the cap (the rule sure of each, each paying)" in sentence
