"""The tree drafters' views (app/figures/search.py and the tree figure's pool): every candidate is accounted for, the
numbers drawn are the trace's, and DDD's recorded checks agree with the frontier values they judged."""
from __future__ import annotations

import math

import pytest

from app.figures.search import (accepted_lengths, calibration, frontier_confidence, growth_figure, pool_view,
                               run_figure)
from app.figures.tree import UNSENT, round_graph, tree_figure
from app.tabs.generate.views import round_views
from decoders import DecodeOptions, generate

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
PROMPT = [3, 9, 4, 1, 7]
SHAPES = {"eagle2": dict(drafter="eagle2", tree_k=6, tree_depth=5, tree_m=30),
          "ddd": dict(drafter="ddd", tree_k=6, tree_m=30, ddd_checks=(2, 3, 4), ddd_x=-0.6, ddd_steps=6,
                      ddd_width=5)}


@pytest.fixture(scope="module", params=list(SHAPES))
def run(request, tiny, drafts):
    options = DecodeOptions(method="speculative", max_new_tokens=24, **SHAPES[request.param])
    return generate(options, PROMPT, target=tiny, draft=drafts["noisy"])


def searched(trace):
    """Rounds that grew a tree (the last rounds may have no room left to draft)."""
    return [r for r in trace.rounds if r.search]


def test_every_candidate_is_sent_or_folded_under_its_nearest_sent_ancestor(run):
    for rnd in searched(run):
        view = pool_view(rnd)
        pool = {e["id"]: e for e in rnd.search["pool"]}
        folded = [e for entries in view.unsent.values() for e in entries]
        assert len(view.entry) + len(folded) == len(pool) == view.size
        for node, entry in view.entry.items():  # a sent candidate is the tree node of the same token and parent
            assert rnd.nodes[node].token == entry["token"]
            parent = rnd.nodes[node].parent
            assert (view.entry[parent]["id"] if parent > 0 else -1) == entry["parent"]
        sent_ids = {e["id"]: n for n, e in view.entry.items()}
        for node, entries in view.unsent.items():
            for entry in entries:
                ancestor = entry["parent"]
                while ancestor >= 0 and ancestor not in sent_ids:
                    ancestor = pool[ancestor]["parent"]
                assert sent_ids.get(ancestor, 0) == node


def test_the_pool_carries_each_candidates_text(run):
    assert len(searched(run)) >= len(run.rounds) - 2
    entries = run.rounds[0].search["pool"]
    assert all(isinstance(e["text"], str) for e in entries)
    sent = pool_view(run.rounds[0]).entry
    assert all(sent[n]["text"] == run.rounds[0].nodes[n].text for n in sent)


def test_the_tree_figure_draws_every_candidate_and_fills_unreached_drafts_by_value(run):
    rnd = next(r for r in searched(run) if pool_view(r).unsent)
    fig = tree_figure(run, rnd.index)
    folds = next(t for t in fig.data if t.meta == "pool")
    view = pool_view(rnd)
    assert sum(int(text.lstrip("+")) for text in folds.text) == view.size - len(view.entry)
    unreached = next((t for t in fig.data if t.meta == "not_reached"), None)
    if unreached is not None:
        values = [view.entry[c[0]]["value"] for c in unreached.customdata]
        assert list(unreached.marker.color) == pytest.approx([math.log10(max(v, 1e-3)) for v in values])
    assert f"grew {view.size} candidates" in fig.layout.title.text.replace("<br>", " ")
    graph = round_graph(rnd)
    assert sum(len(graph.nodes[n][UNSENT]) for n in graph.nodes if graph.nodes[n]["status"] == "pool") == \
        view.size - len(view.entry)


def test_ddds_recorded_checks_match_the_frontier_they_judged(tiny, drafts):
    options = DecodeOptions(method="speculative", max_new_tokens=24, **SHAPES["ddd"])
    trace = generate(options, PROMPT, target=tiny, draft=drafts["noisy"])
    checked = 0
    for rnd in searched(trace):
        by_step = {step: h for step, h, _ in frontier_confidence(rnd)}
        for check in rnd.search["ddd"]:  # checked before step s: the frontier step s - 1 left
            assert check["H"] == pytest.approx(by_step[check["step"] - 1], abs=1e-5)
            checked += 1
        fig = growth_figure(trace, rnd.index)
        marks = next((t for t in fig.data if t.name == "DDD's checks"), None)
        if rnd.search["ddd"]:
            assert list(marks.x) == [c["step"] - 1 for c in rnd.search["ddd"]]
    assert checked, "no round made a DDD check: the test shape never reached a checked step"
    stopped = [r for r in searched(trace) if r.search["stop"] == "ddd"]
    assert stopped, "DDD never stopped early at x = -0.6 with the noisy draft"
    assert "DDD stopped before step" in tree_figure(trace, stopped[0].index).layout.title.text.replace("<br>", " ")


def test_calibration_counts_every_sent_node_once_and_its_rate_is_the_accepted_share(run):
    buckets = calibration(run)
    sent = [(pool_view(r).entry[n.id]["value"], n.status == "accepted") for r in searched(run) for n in r.nodes[1:]]
    assert sum(b["nodes"] for b in buckets) == len(sent)
    for b in buckets:
        inside = [acc for value, acc in sent if b["lo"] <= value < b["hi"] or (b["hi"] == 1.0 and value >= b["lo"])]
        assert b["nodes"] == len(inside) and b["rate"] == pytest.approx(sum(inside) / len(inside))
    assert sum(accepted_lengths(run)) == len(run.rounds)
    assert accepted_lengths(run)[max(r.n_accepted for r in run.rounds)] >= 1


def test_a_tree_run_shows_its_search_not_a_draft_length_rule(run):
    views = round_views(run, 0)
    assert "how the tree grew" in views["positions"].layout.title.text
    assert any("value predict acceptance" in a.text for a in views["rounds"].layout.annotations)
    assert run_figure(run, 0).layout.meta.startswith("Calibration over the run")


def test_a_tree_recorded_without_its_search_says_so(tiny, drafts):
    options = DecodeOptions(method="speculative", max_new_tokens=8, record=False, **SHAPES["eagle2"])
    trace = generate(options, PROMPT, target=tiny, draft=drafts["noisy"])
    assert "nothing to calibrate" in run_figure(trace).layout.meta
    assert "no tree" in growth_figure(trace, 0).layout.meta
