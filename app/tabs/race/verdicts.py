"""Race verdicts (pure): one sentence per method that explains its measured speed from τ, α, c, γ and t(n).

The accounting, in units of one baseline target forward: a round drafts γ tokens at c each, then verifies γ+1
tokens at t(γ+1)/t(1) = `t_ratio`, and yields τ tokens. The baseline yields 1 token per unit, so the expected
speed-up is τ / (γ·c + t_ratio). Whichever term keeps it under 1 is the reason the sentence gives.

γ counts only the rounds that drafted (the table's γ); a round that drafted nothing (a cost-aware cap of 0, no n-gram
to copy) is a plain target step, so over all rounds a round drafts γ·(drafting rounds ÷ rounds). The sentence says
how many rounds drafted nothing and why (round_facts), and says "busy" only from the load the Race measured (load.py).
"""
from __future__ import annotations

from decoders.options import BEAM_METHODS
from decoders.trace import Trace

from app.figures.race import memory_text
from app.figures.stats import totals
from app.tabs.race.load import BUSY_LOAD, is_busy, load_words

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
    """One sentence for one race row (render_race.race_row's keys, plus an optional 't_ratio' and round_facts' keys)."""
    label, speedup = row["label"], row.get("speedup")
    if row["method"] == "baseline":
        return f"**{label}**: one target forward per token, the yardstick every other speed is divided by."
    if speedup is None:
        return f"**{label}**: no speed measured (the run produced no timed tokens)."
    if row["method"] in BEAM_METHODS:
        return _beam_verdict(row, label, speedup)
    return _speculative_verdict(row, label, speedup) + _curve_sentence(row) + _busy_sentence(row)


def _speculative_verdict(row: dict, label: str, speedup: float) -> str:
    tau, gamma, c, t_ratio = row.get("tau") or 1.0, row.get("gamma") or 0.0, row.get("c") or 0.0, row.get("t_ratio")
    head = f"**{label}** ran at {speedup:.2f}× the baseline"
    if gamma == 0:
        return f"{head}: it never drafted ({_never_drafted(row)}), so it can only add overhead."
    share = _drafting_share(row)  # drafted tokens per round over all rounds ÷ over the rounds that drafted
    if row.get("tree") and row.get("draft_steps"):  # a grown tree pays one draft forward per expansion step
        steps = row.get("draft_steps") or 0.0
        cost = steps * c * share + (t_ratio or 1.0)
        mean = "" if share == 1.0 else " on average"
        grew = f"grew a tree in {steps:.1f} draft forwards{mean} at c = {c:.2f} and sent {gamma:.0f} drafts"
        numbers = f"each round {grew}" if share == 1.0 else f"{_rounds_that_drafted(row)} {grew}"
        numbers += f", verified at t(n)/t(1) = {t_ratio:.2f}" if t_ratio else ""
        numbers += f", {_cost_words(share)} {cost:.2f} target forwards for τ = {tau:.2f} tokens" + _idle_clause(row)
        return _tree_verdict(head, speedup, numbers, steps * c, tau, t_ratio, row)
    cost = gamma * c * share + (t_ratio or 1.0)
    mean = "" if share == 1.0 else " on average"
    drafted = (f"copied a tree of {gamma:.1f} drafts{mean} from the text (no draft forward, c = {c:.2f})"
               if row.get("tree") else f"drafted γ = {gamma:.1f} tokens{mean} at c = {c:.2f}")  # a copied tree: suffix
    numbers = f"each round {drafted}" if share == 1.0 else f"{_rounds_that_drafted(row)} {drafted}"
    numbers += f" and verified them at t(n)/t(1) = {t_ratio:.2f}" if t_ratio else ""
    numbers += f", {_cost_words(share)} {cost:.2f} target forwards for τ = {tau:.2f} tokens" + _idle_clause(row)
    alpha = row.get("acceptance_rate") if row.get("tree") else row.get("alpha")  # a copied tree has no chain α
    if speedup >= WIN:
        return f"{head}: {numbers}; {win_reason(c, row.get('acceptance_rate'), tau)}."
    if speedup > 1 / WIN:
        return f"{head}, a draw within timing noise: {numbers}; gains and costs cancel."
    stuck = _mostly_idle(row)
    if stuck:
        reason = stuck
    elif alpha is not None and alpha < 0.3:
        reason = (f"the drafts rarely survived (α = {alpha:.2f}), so most of the drafting was wasted: "
                  f"{DRAFT_MISSES.get(row.get('drafter'), DRAFT_MISS)}")
    elif gamma * c >= tau - 1:
        reason = (f"drafting alone cost γ·c = {gamma * c:.2f} target forwards to gain τ − 1 = {tau - 1:.2f} "
                  "tokens: the draft is too slow for what it gets accepted")
    elif t_ratio and t_ratio > 1.2:
        reason = (f"verifying γ+1 tokens cost {t_ratio:.2f}× one token on this hardware (t(n) grows on a CPU), "
                  "which ate the accepted tokens")
    else:
        reason = "the per-round overheads (bookkeeping, cache trimming) outweighed the accepted tokens"
    return f"{head}: {numbers}; {reason}."


# Why drafts miss, by drafter: the cause a low acceptance points to (never "unrelated text" for a copy that failed).
DRAFT_MISS = "the draft often chose another token than the target"
DRAFT_MISSES = {
    "prompt-lookup": "the target did not go on the way the earlier text did (lookup copies what followed the same "
                     "tokens before)",
    "layer-skip": "a layer skip is not trained, and skipping these layers changes the target's choices",
    "draft-model": "the draft model often chose another token than the target on this text",
    "early-exit": "the trained exit block often chose another token than the full target",
    "prophet": "the trained prophet often chose another token than the target",
}


def round_facts(trace) -> dict:
    """What a speculative run's rounds did, for its sentence: how many drafted, and why the others drafted nothing
    (each round's rule decision: decoders/recorder.py keeps it with recording off); the race's load measurement and
    the cost curve the controller priced with (totals, absent in older traces)."""
    load = (trace.totals or {}).get("race_load")
    if not isinstance(trace, Trace) or trace.method != "speculative":
        return {"load": load}
    options, rounds = trace.options or {}, trace.rounds
    controller = [(r.rule or {}).get("controller") or {} for r in rounds]
    idle = [i for i, r in enumerate(rounds) if r.n_drafted == 0]
    cap_zero = [i for i in idle if controller[i].get("cap") == 0]
    budget = [i for i in idle if i not in cap_zero and rounds[i].rule and rounds[i].rule.get("limit") == 0]
    no_match = [i for i in idle if rounds[i].rule and rounds[i].rule.get("reason") == "no-match"
                and i not in cap_zero + budget]
    facts = {"drafter": options.get("drafter"), "controlled": options.get("controller") == "cost",
             "rounds": len(rounds), "drafting": len(rounds) - len(idle), "cap_zero": len(cap_zero),
             "no_match": len(no_match), "budget": len(budget),
             "probes": sum(1 for c in controller if c.get("probe")),
             "load": load, "cost_curve": (trace.totals or {}).get("cost_curve")}
    alphas = [controller[i]["alpha"] for i in cap_zero if controller[i].get("alpha") is not None]
    facts["cap_zero_alpha"] = sum(alphas) / len(alphas) if alphas else None
    before = [i for i in range(cap_zero[0]) if rounds[i].n_drafted] if cap_zero else []
    if before:  # the drafting round after which the cap first fell to 0
        facts["fell_after"] = (before[-1] + 1, rounds[before[-1]].n_drafted, rounds[before[-1]].n_accepted)
    return facts


def _drafting_share(row: dict) -> float:
    """The rounds that drafted ÷ all rounds (1.0 when the row does not say)."""
    rounds, drafting = row.get("rounds"), row.get("drafting")
    return drafting / rounds if rounds and drafting is not None else 1.0


def _rounds_that_drafted(row: dict) -> str:
    probes = row.get("probes") or 0
    probed = "" if not probes else ", one of them a one-token probe that re-checks α" if probes == 1 else \
        f", {probes} of them one-token probes that re-check α"
    return f"{row['drafting']} of {row['rounds']} rounds drafted{probed}; those"


def _cost_words(share: float) -> str:
    return "a cost of" if share == 1.0 else "an average round cost"


def _idle_clause(row: dict) -> str:
    """'; the other 14 drafted nothing and were plain target steps: …' ('' when every round drafted)."""
    idle = (row.get("rounds") or 0) - (row.get("drafting") or 0)
    if not row.get("rounds") or idle <= 0:
        return ""
    what = "round drafted nothing and was a plain target step" if idle == 1 else \
        f"{idle} drafted nothing and were plain target steps"
    return f"; the other {what}: {_idle_causes(row, idle)}"


def _idle_causes(row: dict, idle: int) -> str:
    """Why the idle rounds drafted nothing, each cause with how many rounds it covers."""
    causes = []
    if row.get("cap_zero"):
        alpha = row.get("cap_zero_alpha")
        at = f"at the acceptance it had seen, α ≈ {alpha:.2f}: " if alpha is not None else ""
        causes.append((row["cap_zero"], f"the cost-aware cap was 0 ({at}no draft length was expected to pay for its "
                                        "verification on this machine's measured t(n))"))
    if row.get("no_match"):
        causes.append((row["no_match"], "prompt lookup found nothing to copy"))
    if row.get("budget"):
        causes.append((row["budget"], "the token budget left no room for a draft"))
    unknown = idle - sum(count for count, _ in causes)
    if unknown > 0:
        causes.append((unknown, "the trace does not record why" if not causes else "no reason was recorded"))
    return "; ".join(_counted(count, idle, cause) for count, cause in causes)


def _counted(count: int, idle: int, cause: str) -> str:
    """'in 3, <cause>'; 'in all 14, …' or 'in both, …' when it covers every idle round; one round: the cause."""
    if count == idle:
        return cause if idle == 1 else f"in {'both' if idle == 2 else f'all {idle}'}, {cause}"
    return f"in {count}, {cause}"


def _never_drafted(row: dict) -> str:
    """Why a run drafted in no round, from its rounds' decisions when recorded."""
    if row.get("cap_zero") and row.get("cap_zero") == row.get("rounds"):
        return "the cost-aware cap was 0 in every round: no draft length was expected to pay on this machine"
    if row.get("no_match"):
        return "prompt lookup found nothing to copy: the text so far never repeats its last tokens"
    return "no draft was offered in any round"


def _mostly_idle(row: dict) -> str:
    """A loss explained by rounds that drafted nothing (at least half of them), else ''."""
    rounds = row.get("rounds") or 0
    if not rounds:
        return ""
    if (row.get("cap_zero") or 0) * 2 >= rounds:
        fell = row.get("fell_after")
        after = f" after round {fell[0]} had {fell[2]} of its {fell[1]} drafts accepted" if fell else ""
        return (f"the cost-aware cap fell to 0{after} and stayed there in {row['cap_zero']} of {rounds} rounds, so "
                "most of the run was plain target steps that still paid the controller's bookkeeping, and the "
                "rounds that drafted could not make up for it")
    if (row.get("no_match") or 0) * 2 >= rounds:
        return (f"prompt lookup found nothing to copy in {row['no_match']} of {rounds} rounds, so most rounds were "
                "plain target steps plus the search")
    return ""


def _curve_sentence(row: dict) -> str:
    """For a cost-aware run: when and under what load its verification-cost curve was measured (if recorded)."""
    curve = row.get("cost_curve")
    if not row.get("controlled") or not isinstance(curve, dict):
        return ""
    said = []
    if curve.get("age_seconds") is not None:
        said.append(f"measured {age_words(curve['age_seconds'])} ago")
    elif curve.get("measured_at"):
        said.append(f"measured {str(curve['measured_at'])[:16].replace('T', ' ')}")
    load = curve.get("load_per_core")
    if load is not None:
        said.append(f"under a load of {load:.1f} per core" + (" (a busy machine)" if load > BUSY_LOAD else ""))
    if curve.get("context_tokens"):
        said.append(f"after a {curve['context_tokens']}-token context")
    if not said:
        return ""
    again = "; it was re-measured for this run" if curve.get("remeasured") else ""
    return (f" Its caps priced verification with this machine's t(n) curve, {', '.join(said)}{again}; no higher than "
            "its repeated timings tell n tokens from one.")


def age_words(seconds: float) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = seconds / size
            return f"{count:.0f} {unit}{'s' if unit == 'day' and round(count) != 1 else ''}"
    return f"{seconds:.0f} s"


def _busy_sentence(row: dict) -> str:
    load = row.get("load")
    if not is_busy(load):
        return ""
    return f" The machine was busy while it ran ({load_words(load)}), which slows and scatters its timings."


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
                  t_ratio: float | None, row: dict) -> str:
    """A tree's reason: its growth (steps·c), its wide verification (t(n) of ~60 tokens), or its accepted length."""
    if speedup >= WIN:
        return f"{head}: {numbers}; the accepted paths were long enough to pay for growing and verifying the tree."
    if speedup > 1 / WIN:
        return f"{head}, a draw within timing noise: {numbers}; gains and costs cancel."
    if _mostly_idle(row):
        reason = _mostly_idle(row)
    elif t_ratio and t_ratio - 1 >= draft_cost and t_ratio > 1.2:
        reason = (f"verifying the whole tree cost {t_ratio:.2f}× one token: on a CPU t(n) grows with n, so the wide "
                  "trees EAGLE-2 sends on a GPU do not pay here (an H200 replaying CUDA graphs measured t(64) = 1.57 "
                  "t(1) for SmolLM2-135M, bench/results/gpu-h200.md); lower M")
    elif draft_cost >= tau - 1:
        reason = (f"growing the tree cost {draft_cost:.2f} target forwards to gain τ − 1 = {tau - 1:.2f} tokens: "
                  "each expansion step is a draft forward")
    else:
        reason = "the per-round overheads (tree masks, bookkeeping) outweighed the accepted tokens"
    return f"{head}: {numbers}; {reason}."


def verdicts_markdown(rows: list[dict]) -> str:
    """One bullet per raced method, then what the machine's load was while they ran; empty before a race."""
    bullets = "\n".join(f"- {verdict(row)}" for row in rows)
    said = load_summary(rows)
    return f"{bullets}\n\n{said}" if bullets and said else bullets


def load_summary(rows: list[dict]) -> str:
    """One sentence on the load measured during the timed runs (race.load): quiet, or busy for whom and how much."""
    measured = [(row["label"], row["load"]) for row in rows if row.get("load")]
    if not measured:
        return ""
    busy = [(label, load) for label, load in measured if is_busy(load)]
    if not busy:
        worst = max(measured, key=lambda item: item[1].get("others_cores") or 0.0)[1]
        return (f"The machine was quiet during the timed runs (measured, at most: {load_words(worst)}), so the "
                "speeds above compare like with like.")
    names = "every method" if len(busy) == len(rows) else ", ".join(label for label, _ in busy)
    worst = max(busy, key=lambda item: item[1].get("others_cores") or 0.0)[1]
    return (f"**The machine was busy** during the timed runs of {names} (measured, at most: {load_words(worst)}): "
            "other work shared the cores, so those speeds are slower and less steady than on a quiet machine, and "
            "a ratio between a busy run and a quiet one is skewed. Race again when the machine is quiet to compare.")
