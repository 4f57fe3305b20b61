"""Lesson 11's chart: the shipped drafters' held-out acceptance, read from the comparison files, next to EAGLE's."""
from __future__ import annotations

import json

import pytest

from app.figures import training


def _write(folder, kind, wins, candidate, shipped):
    data = {"kind": kind, "heldout_sequences": 43, "heldout_tokens": 9512, "wins": wins,
            "scores": {"candidate": {"alpha": candidate}, "shipped": {"alpha": shipped}}}
    (folder / f"drafter-{kind}-smollm2-135m-heldout.json").write_text(json.dumps(data))


def test_tau_compounds_acceptance_depth_by_depth():
    assert training.tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert training.tau([]) == 1.0
    assert training.tau(training.PAPER_ALPHA) > 3 > training.tau([0.46, 0.38, 0.40, 0.43, 0.41])


def test_the_row_drawn_is_the_one_shipped(tmp_path):
    """A comparison that shipped its candidate draws the candidate; one that did not, the drafter kept."""
    _write(tmp_path, "eagle", True, [0.46, 0.38], [0.43, 0.33])
    _write(tmp_path, "prophet", False, [0.30, 0.20], [0.37, 0.42])
    scores = {m.kind: m for m in training.shipped_scores(folder=tmp_path)}
    assert set(scores) == {"eagle", "prophet"}  # early exit has no file here: not drawn
    assert scores["eagle"].alpha == (0.46, 0.38) and scores["prophet"].alpha == (0.37, 0.42)
    fig = training.acceptance_figure(list(scores.values()))
    lines = {trace.name: list(trace.y) for trace in fig.data}
    assert lines["EAGLE head (chain τ 1.63)"] == [0.46, 0.38]
    assert lines[f"{training.PAPER_LABEL} (chain τ {training.tau(training.PAPER_ALPHA):.2f})"] == list(
        training.PAPER_ALPHA)
    assert "best α(1) here 0.46 (EAGLE head)" in fig.layout.title.text.replace("<br>", " ")
    assert all("held-out replies" in text for text in fig.data[0].hovertext)


def test_the_repository_s_comparisons_are_drawn():
    """The files the lesson reads are committed: every shipped SmolLM2 drafter has its held-out comparison."""
    kinds = {m.kind for m in training.shipped_scores()}
    assert kinds == set(training.DRAFTERS)


def test_no_comparison_yet_says_how_to_make_one(tmp_path):
    fig = training.acceptance_figure(training.shipped_scores(folder=tmp_path))
    assert "python -m decoders.training compare" in fig.layout.title.text.replace("<br>", " ")
    assert [trace.name for trace in fig.data] == [f"{training.PAPER_LABEL} (chain τ 3.31)"]
