"""Race verdicts: the sentence names the term that decided the measured speed."""
from __future__ import annotations

from pathlib import Path

import pytest

from app import verdicts
from app.views import read_trace_file

TRACES = Path(__file__).resolve().parent.parent / "assets" / "traces"


def _row(speedup, tau=2.0, gamma=4.0, c=0.0, alpha=0.5, t_ratio=None, method="speculative"):
    return {"label": "m", "method": method, "speedup": speedup, "tau": tau, "gamma": gamma, "c": c, "alpha": alpha,
            "t_ratio": t_ratio}


def test_baseline_is_the_yardstick():
    assert "yardstick" in verdicts.verdict(_row(1.0, method="baseline"))


def test_a_cheap_accurate_draft_wins():
    text = verdicts.verdict(_row(2.5, tau=4.5, c=0.0, alpha=0.8))
    assert "2.50×" in text and "cheap and mostly right" in text


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
    from app import race

    recorded = [read_trace_file(TRACES / name).to_dict() for name in ("baseline-chat.json", "lookup-code-edit.json")]
    monkeypatch.setattr(race, "load_models", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(race, "race_runs", lambda options, prompt: iter(recorded[:len(options)]))
    values = {"prompt": "Rename x", "model": "smollm2-135m", "dtype": "auto", "draft_model": None,
              "methods": ["prompt lookup · static γ=4"], "max_new_tokens": 48, "temperature": 0.0, "seed": 0}
    updates = list(race.race(*(values[name] for name in race.RACE_INPUTS), progress=lambda *a, **k: None))
    assert "race_error" not in updates[-1] or not updates[-1]["race_error"], updates[-1]
    text = updates[-1]["race_verdicts"]
    assert text.count("\n- ") == 1 and "yardstick" in text and "t(n)/t(1) = " in text
