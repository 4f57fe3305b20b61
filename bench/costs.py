"""Cost curves and the Leviathan model of speedup.

t(n) = time of one target forward over n new tokens (after a fixed context) / time of one over 1 token, n = 1..64.
c    = time of one draft forward over 1 token / time of one target forward over 1 token (Leviathan's cost ratio).
S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1))       Leviathan et al. 2023, Thm 3.8 (assumes t(γ+1) = 1)
S_t(α, γ, c, t) = (1 − α^(γ+1)) / ((1 − α)(t(γ+1) + γc))   the same with the measured verification cost
                                                              (Sequoia's hardware-aware form for a chain)
The forwards are made through SpecLab's own CachedModel (all n logits rows, as verification needs them); the
cache is rolled back after every timed call, so each n is measured after the same context.
"""
from __future__ import annotations

import statistics
import time

import torch

from decoders.stats import alpha_from_tau, expected_speedup, expected_tokens  # noqa: F401  (one copy of the formulas)

DEFAULT_NS = tuple(range(1, 65))
QUICK_NS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


leviathan_speedup = expected_speedup  # Leviathan et al. Thm 3.8 (decoders/stats.py)


def speedup_with_verify_cost(alpha: float, gamma: int, c: float, t_verify: float) -> float:
    """Same, with the measured verification cost t(γ+1) in place of 1."""
    return expected_tokens(alpha, gamma) / (t_verify + gamma * c)


def _time(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


@torch.inference_mode()
def forward_cost_curve(model: torch.nn.Module, context: list[int], ns=QUICK_NS, repeats: int = 3) -> dict:
    """Median seconds of a forward over n tokens after `context`, for each n; interleaved over repeats."""
    from decoders.runner import CachedModel

    runner = CachedModel(model)
    runner.forward(context, last_only=True)
    vocab = model.config.vocab_size
    samples = {n: [] for n in ns}
    runner.forward([context[-1]])  # warm-up
    runner.drop_last(1)
    for _ in range(repeats):
        for n in ns:
            tokens = [(context[i % len(context)] + i) % vocab for i in range(n)]
            t0 = time.perf_counter()
            runner.forward(tokens)
            samples[n].append(time.perf_counter() - t0)
            runner.drop_last(n)
    runner.release()
    seconds = {n: statistics.median(v) for n, v in samples.items()}
    base = seconds[ns[0]] if ns[0] == 1 else seconds[min(ns)]
    return {"context_tokens": len(context), "repeats": repeats,
            "seconds": {str(n): s for n, s in seconds.items()},
            "spread": {str(n): [min(v), max(v)] for n, v in samples.items()},
            "t": {str(n): s / base for n, s in seconds.items()}}


@torch.inference_mode()
def draft_cost_ratio(target: torch.nn.Module, draft: torch.nn.Module, context: list[int], repeats: int = 7) -> dict:
    """c = draft one-token step (last logits only, as the drafter runs it) / target one-token forward."""
    from decoders.runner import CachedModel

    out = {}
    for name, model, last_only in (("target", target, False), ("draft", draft, True)):
        runner = CachedModel(model)
        runner.forward(context[:-1], last_only=True)

        def step():
            runner.forward([context[-1]], last_only=last_only)
            runner.drop_last(1)

        step()  # warm-up
        out[name] = statistics.median(_time(step, repeats))
        runner.release()
    return {"target_seconds": out["target"], "draft_seconds": out["draft"], "c": out["draft"] / out["target"]}


def t_of(curve: dict | None, n: int) -> float | None:
    """t(n) from a measured curve, linearly interpolated between measured n; None beyond the curve."""
    if not curve:
        return None
    points = sorted((int(k), v) for k, v in curve["t"].items())
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n0 <= n <= n1:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0) if n1 != n0 else t0
    return points[-1][1] if points and n == points[-1][0] else None
