"""Cost curves and the Leviathan model of speedup.

t(n) = time of one target forward over n new tokens (after a fixed context) / time of one over 1 token, n = 1..64.
c    = time of one draft forward over 1 token / time of one target forward over 1 token (Leviathan's cost ratio).
S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1))       Leviathan et al. 2023, Thm 3.8 (assumes t(γ+1) = 1)
S_t(α, γ, c, t) = (1 − α^(γ+1)) / ((1 − α)(t(γ+1) + γc))   the same with the measured verification cost
                                                              (Sequoia's hardware-aware form for a chain)
The timing itself is decoders/costs.py's (one implementation for the app's controller and bench): SpecLab's own
CachedModel forwards (all n logits rows, as verification needs them), rolled back after every timed call so each n
is measured after the same context, repetitions interleaved over n, medians, and a non-decreasing fit.
"""
from __future__ import annotations

import torch

from decoders import costs as decoder_costs

from decoders.stats import alpha_from_tau, expected_speedup, expected_tokens  # noqa: F401  (one copy of the formulas)

DEFAULT_NS = tuple(range(1, 65))
QUICK_NS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


leviathan_speedup = expected_speedup  # Leviathan et al. Thm 3.8 (decoders/stats.py)


def speedup_with_verify_cost(alpha: float, gamma: int, c: float, t_verify: float) -> float:
    """Same, with the measured verification cost t(γ+1) in place of 1."""
    return expected_tokens(alpha, gamma) / (t_verify + gamma * c)


def forward_cost_curve(model: torch.nn.Module, context: list[int], ns=QUICK_NS, repeats: int = 5) -> dict:
    """t(n) as the results files keep it, measured by decoders/costs.py (the one timing of forwards): medians of
    interleaved repetitions, and t made non-decreasing ("t"; the raw medians are in "t_raw")."""
    timings = decoder_costs.time_forwards(model, tuple(ns), repeats, context_tokens=max(len(context), max(ns)),
                                          trees=False)
    seconds = timings["chain"]
    base = seconds[min(ns)]
    return {"context_tokens": max(len(context), max(ns)), "repeats": repeats,
            "seconds": {str(n): v for n, v in seconds.items()},
            "spread": {str(n): list(v) for n, v in timings["spread"].items()},
            "t": {str(n): v for n, v in decoder_costs.smooth(seconds).items()},
            "t_raw": {str(n): v / base for n, v in seconds.items()}}


def draft_cost_ratio(target: torch.nn.Module, draft: torch.nn.Module, context: list[int], repeats: int = 7) -> dict:
    """c = draft one-token step (last logits only, as the drafter runs it) / target one-token forward."""
    target_s = decoder_costs.time_forwards(target, (1,), repeats, len(context), trees=False)["chain"][1]
    draft_s = decoder_costs.time_forwards(draft, (1,), repeats, len(context), trees=False)["step"][1]
    return {"target_seconds": target_s, "draft_seconds": draft_s, "c": draft_s / target_s}


def t_of(curve: dict | None, n: int) -> float | None:
    """t(n) from a measured curve, linearly interpolated between measured n; None beyond the curve."""
    if not curve:
        return None
    points = sorted((int(k), v) for k, v in curve["t"].items())
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n0 <= n <= n1:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0) if n1 != n0 else t0
    return points[-1][1] if points and n == points[-1][0] else None
