"""The Race's t(n) panel: this machine's curve beside the H100's from bench/results, never an invented one."""
from __future__ import annotations

import json

from app.figures.race import cost_curves_figure, cost_curves_note
from app.tabs.race import curves, runs

HERE = {"label": "this machine (test CPU)", "model": "smollm2-135m", "dtype": "float32", "ns": [1, 4, 16, 64],
        "t": [1.0, 1.2, 2.1, 5.0], "measured_at": "2026-11-25"}


def test_the_h100_curve_comes_from_the_dated_benchmark_file():
    stored = json.loads(curves.ELSEWHERE.read_text(encoding="utf-8"))
    curve = curves.measured_elsewhere()
    assert curve is not None and "measured elsewhere" in curve["label"] and "H100" in curve["label"]
    assert curve["measured_at"] == stored["meta"]["date"][:10]
    expected = stored["runs"]["float32"]["costs"]["target_curve"]["t"]
    assert dict(zip(curve["ns"], curve["t"])) == {int(n): t for n, t in expected.items()}
    assert curve["model"] == stored["runs"]["float32"]["models"]["target"]


def test_both_curves_are_drawn_and_the_note_quotes_them():
    elsewhere = curves.measured_elsewhere()
    fig = cost_curves_figure(HERE, elsewhere)
    names = [trace.name.replace("<br>", " ") for trace in fig.data]  # legend names wrap for a phone (issue 35.6)
    assert [name.split(" · ")[0] for name in names] == [HERE["label"], elsewhere["label"]]
    assert all(len(line) <= 36 for trace in fig.data for line in trace.name.split("<br>"))
    note = cost_curves_note(HERE, elsewhere)
    h100_16 = elsewhere["t"][elsewhere["ns"].index(16)]
    assert "costs 2.10 one-token steps" in note and f"they cost {h100_16:.2f}" in note and "measured elsewhere" in note


def test_without_a_stored_h100_curve_the_panel_says_so(tmp_path):
    missing = curves.measured_elsewhere(tmp_path / "nothing.json")
    assert missing is None
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"meta": {}, "runs": {"float32": {}}}))
    assert curves.measured_elsewhere(broken) is None
    fig = cost_curves_figure(HERE, None)
    assert len(fig.data) == 1
    assert "no H100 t(n) curve is stored in bench/results" in cost_curves_note(HERE, None)


def test_before_this_machine_is_measured_only_the_h100_is_drawn(monkeypatch):
    monkeypatch.setattr(curves, "this_machine", lambda model, dtype, device="auto": None)
    views = runs.cost_views("smollm2-135m", "auto")
    assert len(views["race_costs"].data) == 1 and "not measured yet" in views["race_costs_note"]


def test_the_race_length_help_says_what_runs(monkeypatch):
    from app.tabs.race.layout import race_tokens_help

    assert f"{runs.WARMUP_TOKENS}-token warm-up" in race_tokens_help() and f"then {runs.TIMED_RUNS} timed runs" in \
        race_tokens_help()
    monkeypatch.setattr(runs, "TIMED_RUNS", 5)
    assert "then 5 timed runs" in race_tokens_help()


def test_the_default_race_prompt_is_the_measured_winner():
    """Issue 24: the default race showed no win (free text gives prompt lookup nothing to copy). The default is the
    candidate bench/race_defaults.py measured best, and its measurement is stored."""
    import json

    from app.shared.paths import ROOT
    from bench.race_defaults import CANDIDATES

    measured = json.loads((ROOT / "bench" / "results" / "race-defaults.json").read_text(encoding="utf-8"))
    name = next(n for n, text in CANDIDATES.items() if text == runs.DEFAULT_PROMPT)
    rows = measured["prompts"][name]
    assert measured["methods"] == runs.DEFAULT_METHODS and runs.DEFAULT_MODEL == "smollm2-135m"
    assert all(row["identical"] for row in rows) and all(row["speedup"] > 1.05 for row in rows[1:])
    best = {n: min(r["speedup"] for r in rs[1:]) for n, rs in measured["prompts"].items()}
    assert best[name] == max(best.values())


def test_the_defaults_bench_reads_traces_past_the_race_s_ticks(monkeypatch, tiny):
    """race_runs streams {"running": ...} ticks and {"waiting": ...} lines between its traces (the Race's Stop);
    bench.race_defaults kept only traces (it crashed on the first tick: 'not a SpecLab trace')."""
    import contextlib

    from bench import race_defaults
    from decoders import DecodeOptions, generate

    traces = [generate(DecodeOptions(max_new_tokens=8, record=False), "abcabc", target=tiny).to_dict(),
              generate(DecodeOptions(method="speculative", drafter="prompt-lookup", max_new_tokens=8, record=False),
                       "abcabc", target=tiny).to_dict()]
    stream = [{"waiting": "a Generate run holds the slot"}, {"running": 0, "phase": "its warm-up"}, traces[0],
              {"running": 1, "phase": "timed run 1 of 3"}, traces[1]]
    monkeypatch.setattr(race_defaults, "loaded", lambda *runs: contextlib.nullcontext())
    monkeypatch.setattr(race_defaults.race, "race_runs", lambda options, prompt: iter(stream))
    rows = race_defaults.measure("abcabc", 8, runs.DEFAULT_METHODS[:1])
    assert len(rows) == 2 and rows[0]["label"] == "autoregressive baseline" and rows[1]["identical"]
