"""Totals over a trace, with the conventions users know from vLLM and the EAGLE papers.

τ (mean acceptance length) = output tokens / target verification forwards, so it includes the bonus token.
Draft acceptance rate = accepted / drafted (vLLM). Per-position acceptance: of the rounds that drafted a token
at depth i, the share whose accepted path reached depth i. Tokens/s count decode time only (after prefill).
"""
from __future__ import annotations

from collections import Counter

from .trace import Trace


def summarize(trace: Trace) -> dict:
    rounds = trace.rounds
    tokens = len(trace.output_ids)
    target_forwards = sum(r.target_forwards for r in rounds)
    drafted = sum(r.n_drafted for r in rounds)
    accepted = sum(r.n_accepted for r in rounds)
    seconds = {k: sum(r.seconds.get(k, 0.0) for r in rounds) for k in ("draft", "verify", "bookkeeping")}
    return {
        "tokens": tokens,
        "rounds": len(rounds),
        "target_forwards": target_forwards,
        "draft_forwards": sum(r.draft_forwards for r in rounds),
        "drafted": drafted,
        "accepted": accepted,
        "tau": tokens / target_forwards if target_forwards else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "per_position_acceptance": per_position_acceptance(trace),
        "accepted_histogram": accepted_histogram(trace),
        "tokens_per_second": tokens / trace.decode_seconds if trace.decode_seconds > 0 else None,
        "steady_tokens_per_second": steady_rate(trace),
        "decode_seconds": trace.decode_seconds,
        "prefill_seconds": trace.prefill_seconds,
        "seconds": seconds,
        **controller_summary(trace),
    }


def controller_summary(trace: Trace) -> dict:
    """For a run under the draft controller (decoders/controller.py): how many of its rounds had cap 0, how many
    were probes, the mean cap ({"controller": ...}; {} for other runs). The Race's sentences read it."""
    decisions = [r.rule["controller"] for r in trace.rounds if r.rule and "cap" in (r.rule.get("controller") or {})]
    if not decisions:
        return {}
    caps = [d["cap"] for d in decisions]
    return {"controller": {"rounds": len(decisions), "cap_zero": caps.count(0),
                           "probes": sum(1 for d in decisions if d.get("probe")), "mean_cap": sum(caps) / len(caps)}}


def steady_rate(trace: Trace) -> float | None:
    """Tokens after the first round per second after it (decoders/clock.py: the reading bench compares with
    transformers, whose first forward fuses prefill and the first round). None for a one-round run."""
    if len(trace.rounds) < 2:
        return None
    first = trace.rounds[0]
    seconds = trace.decode_seconds - sum(first.seconds.get(k, 0.0) for k in ("draft", "verify", "bookkeeping"))
    tokens = len(trace.output_ids) - len(first.committed)
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def per_position_acceptance(trace: Trace) -> list[float]:
    """Entry i-1 = P(depth i accepted | a token was drafted at depth i)."""
    depth = max((r.n_drafted for r in trace.rounds), default=0)
    rates = []
    for position in range(1, depth + 1):
        offered = [r for r in trace.rounds if _draft_depth(r) >= position]
        if offered:
            rates.append(sum(r.n_accepted >= position for r in offered) / len(offered))
    return rates


def accepted_histogram(trace: Trace) -> list[int]:
    """Entry k = how many rounds accepted exactly k drafts, over rounds that offered any (a list: JSON-safe)."""
    counts = Counter(r.n_accepted for r in trace.rounds if r.n_drafted > 0)
    return [counts.get(k, 0) for k in range(max(counts, default=-1) + 1)]


def _draft_depth(rnd) -> int:
    """Deepest drafted position: n_drafted for a chain; the deepest node for a tree."""
    if rnd.nodes:
        return max(n.depth for n in rnd.nodes)
    return rnd.n_drafted


# ---------------------------------------------------------------- Leviathan et al. 2023, with i.i.d. acceptance α

def expected_tokens(alpha: float, gamma: float) -> float:
    """E[tokens per target forward] = (1 − α^(γ+1)) / (1 − α); γ + 1 when α = 1."""
    if alpha >= 1.0 - 1e-12:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: float, c: float) -> float:
    """S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1)); c = draft step time / target step time."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def alpha_from_tau(tau: float | None, gamma: float) -> float | None:
    """Solve expected_tokens(α, γ) = τ for α in [0, 1] by bisection (the left side grows with α)."""
    if tau is None or gamma < 1:
        return None
    if tau <= 1.0:
        return 0.0
    if tau >= gamma + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens(mid, gamma) < tau:
            low = mid
        else:
            high = mid
    return (low + high) / 2
