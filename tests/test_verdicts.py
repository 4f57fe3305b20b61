"""Race verdicts: the sentence names the term that decided the measured speed."""
from __future__ import annotations

import contextlib

from pathlib import Path

import pytest

from app.tabs.race import verdicts
from app.tabs.generate.views import read_trace_file

TRACES = Path(__file__).resolve().parent.parent / "assets" / "traces"


def _row(speedup, tau=2.0, gamma=4.0, c=0.0, alpha=0.5, t_ratio=None, method="speculative"):
    return {"label": "m", "method": method, "speedup": speedup, "tau": tau, "gamma": gamma, "c": c, "alpha": alpha,
            "t_ratio": t_ratio}


def test_baseline_is_the_yardstick():
    assert "yardstick" in verdicts.verdict(_row(1.0, method="baseline"))


def test_a_cheap_accurate_draft_wins():
    text = verdicts.verdict({**_row(2.5, tau=4.5, c=0.0, alpha=0.8), "acceptance_rate": 0.85})
    assert "2.50×" in text and "nearly free" in text and "mostly right (85% of them were accepted)" in text


def test_a_cheap_draft_that_is_mostly_wrong_is_not_called_mostly_right():
    """Issue 24: prompt lookup at 13% acceptance was called "cheap and mostly right"."""
    text = verdicts.verdict({**_row(1.2, tau=1.4, c=0.01, alpha=0.1), "acceptance_rate": 0.13})
    assert "mostly right" not in text and "only 13% of them were accepted" in text and "nearly free" in text


def test_a_costly_draft_wins_only_by_acceptance():
    text = verdicts.verdict({**_row(1.3, tau=3.0, c=0.3, alpha=0.7), "acceptance_rate": 0.45})
    assert "c = 0.30" in text and "45% of them were accepted" in text and "nearly free" not in text


def test_no_drafts_means_overhead_only():
    assert "never drafted" in verdicts.verdict(_row(0.97, gamma=0.0))


def test_an_untrained_draft_loses_on_acceptance():
    text = verdicts.verdict(_row(0.6, tau=1.2, gamma=3.0, c=0.4, alpha=0.1))
    assert "rarely survived (α = 0.10)" in text


def test_a_slow_draft_loses_on_cost():
    text = verdicts.verdict(_row(0.7, tau=2.5, gamma=4.0, c=0.5, alpha=0.45))
    assert "γ·c = 2.00" in text and "too slow" in text


def test_growing_verify_time_is_named():
    text = verdicts.verdict(_row(0.8, tau=2.0, gamma=4.0, c=0.05, alpha=0.4, t_ratio=2.5))
    assert "2.50× one token" in text


def test_a_draw_is_called_noise():
    assert "within timing noise" in verdicts.verdict(_row(1.01))


def test_predicted_speedup_is_tokens_over_cost():
    assert verdicts.predicted_speedup(3.0, 4.0, 0.25, 1.0) == pytest.approx(1.5)


def test_verify_ratio_from_recorded_traces():
    baseline = read_trace_file(TRACES / "baseline-chat.json")
    assert verdicts.verify_ratio(baseline, baseline) == pytest.approx(1.0)
    lookup = read_trace_file(TRACES / "lookup-code-edit.json")
    assert verdicts.verify_ratio(lookup, baseline) > 0


def test_one_bullet_per_row():
    rows = [_row(1.0, method="baseline"), _row(2.0, tau=3.0, alpha=0.7)]
    assert verdicts.verdicts_markdown(rows).count("\n- ") == 1 and verdicts.verdicts_markdown([]) == ""


def test_the_race_yields_one_verdict_per_method(monkeypatch):
    """The Race handler end to end on recorded traces (no model): its last update carries the verdicts."""
    from app.tabs.race import runs as race

    recorded = [read_trace_file(TRACES / name).to_dict() for name in ("baseline-chat.json", "lookup-code-edit.json")]
    monkeypatch.setattr(race, "loaded",
                        lambda *runs, report=None, turn=None, stop=None:
                        contextlib.nullcontext([(None, None)] * len(runs)))
    monkeypatch.setattr(race, "race_runs", lambda options, prompt: (data for data in recorded[:len(options)]))
    values = {"prompt": "Rename x", "model": "smollm2-135m", "dtype": "auto", "draft_model": None,
              "methods": ["prompt lookup · static γ=4"], "max_new_tokens": 48, "temperature": 0.0, "seed": 0}
    updates = list(race.race(*(values[name] for name in race.RACE_INPUTS), progress=lambda *a, **k: None))
    assert "race_error" not in updates[-1] or not updates[-1]["race_error"], updates[-1]
    text = updates[-1]["race_verdicts"]
    assert text.count("\n- ") == 1 and "yardstick" in text and "t(n)/t(1) = " in text


def _tree_row(speedup, tau=2.5, gamma=59.0, c=0.1, t_ratio=1.0, steps=6.0):
    return {**_row(speedup, tau=tau, gamma=gamma, c=c, alpha=None, t_ratio=t_ratio), "tree": True,
            "draft_steps": steps}


def test_a_tree_pays_per_expansion_step_not_per_draft_sent():
    """59 drafts from 6 draft forwards cost 6·c, not 59·c: a chain's γ·c would call this tree 10× too costly."""
    text = verdicts.verdict(_tree_row(0.8, tau=1.5, c=0.1, t_ratio=1.1, steps=6.0))
    assert "6.0 draft forwards" in text and "sent 59 drafts" in text and "cost of 1.70 target forwards" in text
    assert "growing the tree cost 0.60" in text


def test_a_tree_that_loses_to_its_wide_verification_says_so():
    text = verdicts.verdict(_tree_row(0.5, tau=2.5, c=0.02, t_ratio=3.0, steps=6.0))
    assert "verifying the whole tree cost 3.00×" in text and "lower M" in text


def test_a_tree_run_has_no_chain_alpha(tiny, drafts):
    from app.figures.race import race_row
    from decoders import DecodeOptions, generate

    base = generate(DecodeOptions(max_new_tokens=12), [3, 9, 4], target=tiny)
    tree = generate(DecodeOptions(method="speculative", drafter="eagle2", tree_k=4, tree_depth=4, tree_m=12,
                                  max_new_tokens=12), [3, 9, 4], target=tiny, draft=drafts["noisy"])
    row = race_row(tree, base)
    assert row["tree"] and row["alpha"] is None and row["gamma"] > 4  # many drafts per round ...
    assert row["draft_steps"] == pytest.approx(sum(r.draft_forwards for r in tree.rounds if r.n_drafted)
                                               / sum(1 for r in tree.rounds if r.n_drafted))  # ... few forwards
    assert row["draft_steps"] < row["gamma"]


# ---- issue 35.4: the sentences describe the rounds that happened --------------------------------------------------
def _round(index: int, drafted: int, accepted: int, cap: int | None = None, probe: bool = False,
           reason: str = "limit", alpha: float = 0.2, limit: int | None = None):
    """A round recorded with recording off: counters, the committed ids, the rule's decision (decoders/recorder.py)."""
    from decoders.trace import RoundRecord

    committed = list(range(accepted + 1))
    limit = limit if limit is not None else drafted if cap is None else cap
    rule = {"name": "static", "limit": limit, "reason": reason, "checks": []}
    if cap is not None:
        rule["controller"] = {"cap": cap, "best": 0 if cap == 0 or probe else cap, "probe": probe, "alpha": alpha,
                              "c": 0.01}
    return RoundRecord(index=index, n_drafted=drafted, n_accepted=accepted, committed=committed,
                       provenance=["accepted"] * accepted + ["bonus" if accepted == drafted and drafted else
                                                             "resampled" if drafted else "baseline"],
                       bonus_token=0, bonus_text="", bonus_source="baseline", rule=rule, draft_forwards=0,
                       seconds={"draft": 0.001 if drafted else 0.0, "verify": 0.05, "bookkeeping": 0.001})


def _trace(rounds, seconds: float, totals: dict | None = None, method="speculative", **options):
    from decoders.stats import summarize
    from decoders.trace import Trace

    trace = Trace(method=method, label=f"speculative · {options.get('drafter', 'baseline')}", options=options,
                  models={}, precision="", prompt="Repeat this list exactly", prompt_ids=[1, 2, 3],
                  output_ids=[t for r in rounds for t in r.committed], rounds=rounds, stop_reason="max_new_tokens",
                  decode_seconds=seconds)
    trace.totals = {**summarize(trace), **(totals or {})}
    return trace


BUSY = {"cores": 2, "seconds": 12.0, "load_per_core_before": 2.1, "load_per_core_after": 3.0, "others_cores": 1.3}
QUIET = {"cores": 2, "seconds": 12.0, "load_per_core_before": 0.2, "load_per_core_after": 0.9, "others_cores": 0.05}
CURVE = {"measured_at": "2026-11-25T10:00:00", "age_seconds": 7200, "load_per_core": 1.6, "context_tokens": 96,
         "remeasured": False, "machine": "AMD EPYC, 2 cores"}


def _stuck_lookup(load=BUSY, curve=CURVE):
    """The issue's default race: round 1 drafts 15 and all are rejected, then the cap stays at 0 in 14 of 18 rounds;
    3 more rounds draft (one a one-token probe)."""
    rounds = [_round(0, 15, 0, cap=15, alpha=0.75)]
    rounds += [_round(i, 0, 0, cap=0) for i in range(1, 8)]
    rounds += [_round(8, 1, 1, cap=1, probe=True)]
    rounds += [_round(i, 0, 0, cap=0) for i in range(9, 16)]
    rounds += [_round(16, 4, 2, cap=4, alpha=0.4), _round(17, 4, 0, cap=4, alpha=0.4)]
    totals = {"race_load": load, **({"cost_curve": curve} if curve else {})}
    return _trace(rounds, seconds=3.0, totals=totals, drafter="prompt-lookup", rule="static", controller="cost",
                  temperature=0.0)


def _baseline(load=BUSY):
    return _trace([_round(i, 0, 0) for i in range(24)], seconds=1.2, totals={"race_load": load}, method="baseline")


def _rows(*traces):
    from app.figures.race import race_row

    base = traces[0]
    return [{**race_row(t, base), "t_ratio": verdicts.verify_ratio(t, base), **verdicts.round_facts(t)}
            for t in traces]


def test_a_stuck_cap_is_named_with_its_rounds_and_not_blamed_on_the_draft():
    """Issue 35.4: 'each round drafted γ = 4.5' when 14 of 18 drafted nothing, and 'unrelated text' on a copy task."""
    rows = _rows(_baseline(), _stuck_lookup())
    text = verdicts.verdict(rows[1])
    assert rows[1]["speedup"] < 1 / verdicts.WIN
    assert "each round drafted" not in text and "unrelated text" not in text and "untrained" not in text
    assert "4 of 18 rounds drafted, one of them a one-token probe" in text
    assert "γ = 6.0 tokens on average" in text  # 24 drafts over the 4 rounds that drafted
    assert "the other 14 drafted nothing and were plain target steps: in all 14, the cost-aware cap was 0 (at the " \
           "acceptance it had seen, α ≈ 0.20: no draft length was expected to pay" in text
    assert "cap fell to 0 after round 1 had 0 of its 15 drafts accepted and stayed there in 14 of 18 rounds" in text


def test_the_load_and_the_cost_curve_are_said_from_their_measurements():
    rows = _rows(_baseline(), _stuck_lookup())
    text = verdicts.verdict(rows[1])
    assert "The machine was busy while it ran (other processes used 1.3 of 2 cores; load average 2.1 → 3.0 per " \
           "core)" in text
    assert "t(n) curve, measured 2 h ago, under a load of 1.6 per core (a busy machine), after a 96-token context" \
        in text
    summary = verdicts.verdicts_markdown(rows)
    assert "**The machine was busy** during the timed runs of every method (measured, at most: other processes used " \
           "1.3 of 2 cores" in summary


def test_a_quiet_race_is_not_called_busy_and_old_traces_still_read():
    rows = _rows(_baseline(QUIET), _stuck_lookup(QUIET, curve=None))
    text = verdicts.verdicts_markdown(rows)
    assert "busy" not in text and "The machine was quiet during the timed runs" in text
    assert "t(n) curve" not in text  # no cost_curve recorded: nothing claimed about it
    older = _stuck_lookup(None, curve=None)
    for rnd in older.rounds:
        rnd.rule = None  # a trace from before the rule decision was kept with recording off
    row = _rows(_baseline(None), older)[1]
    said = verdicts.verdict(row)
    assert "the other 14 drafted nothing and were plain target steps: in all 14, the trace does not record why" in said
    assert "quiet" not in said


def test_a_copy_task_with_low_acceptance_blames_the_copy_not_the_text():
    rounds = [_round(i, 4, 0) for i in range(12)]
    row = _rows(_baseline(QUIET), _trace(rounds, seconds=2.0, drafter="prompt-lookup", rule="static",
                                         temperature=0.0))[1]
    text = verdicts.verdict(row)
    assert "each round drafted γ = 4.0" in text and "unrelated text" not in text
    assert "the target did not go on the way the earlier text did" in text


def test_rounds_without_a_match_are_counted():
    rounds = [_round(i, 0, 0, reason="no-match", limit=4) for i in range(10)] + [_round(10, 3, 3)]
    row = _rows(_baseline(QUIET), _trace(rounds, seconds=1.0, drafter="prompt-lookup", rule="static"))[1]
    text = verdicts.verdict(row)
    assert "1 of 11 rounds drafted" in text and "in all 10, prompt lookup found nothing to copy" in text


def test_unrecorded_runs_keep_each_round_s_decision(tiny, drafts):
    """Recording off (the Race) still keeps why a round drafted nothing: the controller's cap, without its curves."""
    from decoders import DecodeOptions, generate

    options = DecodeOptions(method="speculative", rule="static", controller="cost", max_new_tokens=40, record=False)
    trace = generate(options, [3, 9, 4, 1, 7, 22, 5], target=tiny, draft=drafts["unrelated"])
    decisions = [r.rule["controller"] for r in trace.rounds]
    assert decisions and all("gain" not in d and "cap" in d for d in decisions)
    assert all(r.rule["limit"] == min(d["cap"], 39) or r.n_drafted <= r.rule["limit"]
               for r, d in zip(trace.rounds, decisions))
    facts = verdicts.round_facts(trace)
    idle = [r for r in trace.rounds if r.n_drafted == 0]
    assert facts["rounds"] == len(trace.rounds) and facts["cap_zero"] > 0  # the unrelated draft never pays
    assert facts["cap_zero"] + facts["budget"] == len(idle)  # a probe in the last round has no budget left
