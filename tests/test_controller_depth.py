"""The draft controller's acceptance by depth (decoders/controller.py): α_k learnt per class of depths, shrunk toward
the class above, and the gain curve it feeds (with one α for every depth, Leviathan's)."""
from __future__ import annotations

import pytest

from decoders.controller import AcceptanceEstimate, CostAwareRule, gain_curve
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
