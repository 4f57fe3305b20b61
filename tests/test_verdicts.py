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
                        lambda *runs, report=None, turn=None: contextlib.nullcontext([(None, None)] * len(runs)))
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
