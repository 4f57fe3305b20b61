"""Race verdicts (pure): one sentence per method that explains its measured speed from τ, α, c, γ and t(n).

The accounting, in units of one baseline target forward: a round drafts γ tokens at c each, then verifies γ+1
tokens at t(γ+1)/t(1) = `t_ratio`, and yields τ tokens. The baseline yields 1 token per unit, so the expected
speed-up is τ / (γ·c + t_ratio). Whichever term keeps it under 1 is the reason the sentence gives.
"""
from __future__ import annotations

from decoders.options import BEAM_METHODS
from decoders.trace import Trace

from app.figures.race import memory_text
from app.figures.stats import totals

WIN = 1.05  # above this a speed-up is called a win; between 1/WIN and WIN it is a draw (timing noise)


def verify_ratio(trace: Trace, baseline: Trace) -> float | None:
    """t(γ+1)/t(1): seconds per verifying target forward of this run ÷ seconds per target forward of the baseline."""
    t, b = totals(trace), totals(baseline)
    if not t["target_forwards"] or not b["target_forwards"] or not b["seconds"]["verify"]:
        return None
    return (t["seconds"]["verify"] / t["target_forwards"]) / (b["seconds"]["verify"] / b["target_forwards"])


def predicted_speedup(tau: float, gamma: float, c: float, t_ratio: float) -> float:
    """τ / (γ·c + t(γ+1)/t(1)): tokens per round over the round's cost in baseline forwards."""
    return tau / (gamma * c + t_ratio)


def verdict(row: dict) -> str:
    """One sentence for one race row (render_race.race_row's keys, plus an optional 't_ratio')."""
    label, speedup = row["label"], row.get("speedup")
    if row["method"] == "baseline":
        return f"**{label}**: one target forward per token, the yardstick every other speed is divided by."
    if speedup is None:
        return f"**{label}**: no speed measured (the run produced no timed tokens)."
    if row["method"] in BEAM_METHODS:
        return _beam_verdict(row, label, speedup)
    tau, gamma, c, t_ratio = row.get("tau") or 1.0, row.get("gamma") or 0.0, row.get("c") or 0.0, row.get("t_ratio")
    head = f"**{label}** ran at {speedup:.2f}× the baseline"
    if gamma == 0:
        return (f"{head}: it never drafted (no draft was offered; prompt lookup finds nothing to copy in free "
                "text), so it can only add overhead.")
    if row.get("tree") and row.get("draft_steps"):  # a grown tree pays one draft forward per expansion step
        steps = row.get("draft_steps") or 0.0
        cost = steps * c + (t_ratio or 1.0)
        numbers = f"each round grew a tree in {steps:.1f} draft forwards at c = {c:.2f} and sent {gamma:.0f} drafts"
        numbers += f", verified at t(n)/t(1) = {t_ratio:.2f}" if t_ratio else ""
        numbers += f", a cost of {cost:.2f} target forwards for τ = {tau:.2f} tokens"
        return _tree_verdict(head, speedup, numbers, steps * c, tau, t_ratio)
    cost = gamma * c + (t_ratio or 1.0)
    drafted = (f"copied a tree of {gamma:.1f} drafts from the text (no draft forward, c = {c:.2f})" if row.get("tree")
               else f"drafted γ = {gamma:.1f} tokens at c = {c:.2f}")  # a tree with no draft steps: suffix decoding
    numbers = (f"each round {drafted} and verified them at t(n)/t(1) = {t_ratio:.2f}" if t_ratio
               else f"each round {drafted}")
    numbers += f", a cost of {cost:.2f} target forwards for τ = {tau:.2f} tokens"
    alpha = row.get("acceptance_rate") if row.get("tree") else row.get("alpha")  # a copied tree has no chain α
    if speedup >= WIN:
        return f"{head}: {numbers}; {win_reason(c, row.get('acceptance_rate'), tau)}."
    if speedup > 1 / WIN:
        return f"{head}, a draw within timing noise: {numbers}; gains and costs cancel."
    if alpha is not None and alpha < 0.3:
        reason = (f"the drafts rarely survived (α = {alpha:.2f}), so most of the drafting was wasted; the draft "
                  "does not predict this target (an untrained layer skip or unrelated text)")
    elif gamma * c >= tau - 1:
        reason = (f"drafting alone cost γ·c = {gamma * c:.2f} target forwards to gain τ − 1 = {tau - 1:.2f} "
                  "tokens: the draft is too slow for what it gets accepted")
    elif t_ratio and t_ratio > 1.2:
        reason = (f"verifying γ+1 tokens cost {t_ratio:.2f}× one token on this hardware (t(n) grows on a CPU), "
                  "which ate the accepted tokens")
    else:
        reason = "the per-round overheads (bookkeeping, cache trimming) outweighed the accepted tokens"
    return f"{head}: {numbers}; {reason}."


CHEAP = 0.1  # c below this: a draft costs under a tenth of a target forward (prompt lookup: a string search)
MOSTLY = 0.6  # acceptance at or above this: most drafts survive; below FEW: most are thrown away
FEW = 0.3


def win_reason(c: float, acceptance: float | None, tau: float) -> str:
    """Why a chain method won, from its measured cost AND acceptance together: a cheap draft can win while most of
    its drafts are rejected (each accepted one is nearly free), a costly one only when most are accepted."""
    cost = (f"the drafts were nearly free (c = {c:.2f} target forwards each)" if c < CHEAP else
            f"the drafts cost c = {c:.2f} target forwards each")
    if acceptance is None:
        return f"{cost}, and τ = {tau:.2f} tokens per round paid for them"
    share = f"{acceptance:.0%} of them were accepted"
    if acceptance >= MOSTLY:
        return f"{cost} and mostly right ({share})"
    if c < CHEAP:
        return (f"{cost}, so even though only {share}, each round still gained τ − 1 = {tau - 1:.2f} tokens "
                "for almost nothing" if acceptance < FEW else
                f"{cost} and {share}: the accepted ones came almost for nothing")
    return f"{cost} and {share}: enough survived to pay for drafting"


def _beam_verdict(row: dict, label: str, speedup: float) -> str:
    """Beams do more work per token than greedy decoding, by design: the sentence says what that costs."""
    width = row.get("width") or 0
    memory = row.get("peak_kv_bytes")
    held = f" and held {memory_text(memory)} of KV cache" if memory else ""
    what = {"beam-search": "keeps the best of many continuations", "beam-sampling": "samples several continuations",
            "dsbd": "drafts a forest of beams with the small model and verifies it in one target forward, choosing "
                    "each layer's width from the draft's agreement"}[row["method"]]
    return (f"**{label}** ran at {speedup:.2f}× the baseline{held}: it {what}, so each target forward scores up to "
            f"{width} rows instead of one. It answers a different question (a better or more diverse sequence), "
            f"so its output is not meant to equal greedy decoding; compare it with the other beam methods.")


def _tree_verdict(head: str, speedup: float, numbers: str, draft_cost: float, tau: float,
                  t_ratio: float | None) -> str:
    """A tree's reason: its growth (steps·c), its wide verification (t(n) of ~60 tokens), or its accepted length."""
    if speedup >= WIN:
        return f"{head}: {numbers}; the accepted paths were long enough to pay for growing and verifying the tree."
    if speedup > 1 / WIN:
        return f"{head}, a draw within timing noise: {numbers}; gains and costs cancel."
    if t_ratio and t_ratio - 1 >= draft_cost and t_ratio > 1.2:
        reason = (f"verifying the whole tree cost {t_ratio:.2f}× one token: on a CPU t(n) grows with n, so the wide "
                  "trees EAGLE-2 sends on a GPU (where t(60) ≈ t(1)) do not pay here; lower M")
    elif draft_cost >= tau - 1:
        reason = (f"growing the tree cost {draft_cost:.2f} target forwards to gain τ − 1 = {tau - 1:.2f} tokens: "
                  "each expansion step is a draft forward")
    else:
        reason = "the per-round overheads (tree masks, bookkeeping) outweighed the accepted tokens"
    return f"{head}: {numbers}; {reason}."


def verdicts_markdown(rows: list[dict]) -> str:
    """One bullet per raced method; empty before a race."""
    return "\n".join(f"- {verdict(row)}" for row in rows)
