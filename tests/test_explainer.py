"""The rejection-sampling explainer draws through the real verification core, and its histogram follows p."""
from __future__ import annotations

import pytest
import torch

import decoders.verify
from app.tabs.learn import explainer
from app.shared import glossary
from chi_square import chi_square_pvalue

# Bound: a seeded run is deterministic; a correct sampler passes at p-value > 1e-3 (fails 1 in 1,000 seeds by
# chance), a broken residual lands far below 1e-6 at these draw counts.
PASS, FAIL = 1e-3, 1e-6


def _replace_residual_by_p(monkeypatch):
    """The classic bug: on rejection, draw from p itself instead of norm(max(p − q, 0))."""
    monkeypatch.setattr(decoders.verify, "residual", lambda r, q: r)


@pytest.mark.parametrize("siblings", [1, 3])
def test_histogram_from_the_core_matches_p(siblings):
    position = explainer.toy_position(0.5)
    counts = explainer.sample_counts(position, 20_000, seed=1, n_siblings=siblings)
    assert chi_square_pvalue(counts, position.p) > PASS


@pytest.mark.parametrize("siblings", [1, 3])
def test_histogram_fails_when_the_residual_is_replaced_by_p(monkeypatch, siblings):
    _replace_residual_by_p(monkeypatch)
    position = explainer.toy_position(0.5)
    counts = explainer.sample_counts(position, 20_000, seed=1, n_siblings=siblings)
    assert chi_square_pvalue(counts, position.p) < FAIL


def test_the_page_s_1000_draws_pass_and_a_mutated_residual_fails(monkeypatch):
    position = explainer.toy_position(1.0)  # the most disagreeing draft: rejections are frequent
    assert chi_square_pvalue(explainer.sample_counts(position, 1000, seed=0), position.p) > PASS
    _replace_residual_by_p(monkeypatch)
    assert chi_square_pvalue(explainer.sample_counts(position, 1000, seed=0), position.p) < FAIL


def test_a_draft_equal_to_the_target_is_always_accepted():
    position = explainer.toy_position(0.0)
    assert position.acceptance == pytest.approx(1.0)
    for seed in range(20):
        _, verdict, _ = explainer.one_step(position, seed)
        assert verdict.path, "q = p must accept every draft"


def test_acceptance_falls_as_the_draft_disagrees():
    alphas = [explainer.toy_position(m).acceptance for m in (0.0, 0.5, 1.0)]
    assert alphas[0] > alphas[1] > alphas[2]


def test_the_figure_has_the_named_traces():
    position = explainer.toy_position(0.5)
    fig = explainer.position_figure(position, explainer.sample_counts(position, 50))
    names = [trace.name for trace in fig.data]
    assert names[:4] == list(explainer.TRACE_NAMES)
    assert names[4] == "sampled (50 draws)"
    accepted = fig.data[2].y
    assert accepted == pytest.approx(torch.minimum(position.p, position.q).tolist())
    assert sum(fig.data[3].y) == pytest.approx(1.0)  # the residual is a distribution


def test_step_handler_tells_the_uniform_draw_and_the_outcome():
    seen = set()
    for seed in range(30):
        _, story = list(explainer.on_step(1.0, seed, 1))[-1]  # the last update: the step's story
        assert "u = " in story
        seen.add("Every candidate was rejected" in story)
    assert seen == {True, False}  # over 30 seeds both an acceptance and a rejection are told


def test_sample_handler_reports_the_distance_to_p():
    fig, text = list(explainer.on_sample(0.5, 0, 2, n_draws=1000))[-1]
    assert text.startswith("1000 draws through the verification core")
    assert len(fig.data) == 5


def test_bad_input_gets_a_fix_it_message():
    with pytest.raises(ValueError, match="between 0 and 1"):
        explainer.toy_position(1.5)
    with pytest.raises(ValueError, match="at least 1"):
        explainer.sample_counts(explainer.toy_position(0.5), 0)


def test_glossary_names_every_symbol():
    text = glossary.markdown()
    for symbol in ("τ", "α", "c", "λ", "γ", "t(n)"):
        assert f"**{symbol}**" in text


def test_the_explainers_pytorch_work_runs_inside_the_decode_slot(monkeypatch):
    """Review 14d8f23 #8: the explainer ran its PyTorch draws with no slot, so a server stopped meanwhile could abort
    (status 134). Each click now computes inside the slot, and says what it waits for while another run holds it."""
    import threading

    from app.shared.decode_slot import DECODE_SLOT

    held = []
    real = explainer.sample_counts
    monkeypatch.setattr(explainer, "sample_counts",
                        lambda *a, **k: (held.append(DECODE_SLOT.locked()), real(*a, **k))[1])
    outputs = list(explainer.on_sample(0.5, 0, 1, n_draws=50))
    assert held == [True] and "50 draws through the verification core" in outputs[-1][1]

    release, holding = threading.Event(), threading.Event()

    def race():
        with DECODE_SLOT.hold(what="a Race"):
            holding.set()
            release.wait(10)
    threading.Thread(target=race, daemon=True).start()
    assert holding.wait(5)
    clicks = explainer.on_sample(0.5, 0, 1, n_draws=50)
    try:
        assert "a Race has been running for" in next(clicks)[1] and held == [True]
    finally:
        release.set()
    assert "draws through the verification core" in list(clicks)[-1][1] and held == [True, True]
