"""Suffix decoding in the app: the Generate tab draws the matched tail and the candidate counts from the trace, the
store of earlier outputs is the visitor's own (passed into the run, filled once per finished run, shown, cleared),
and the Race can race it."""
from __future__ import annotations

import copy
import html

import pytest
from app_fakes import fake_loaded

from app.figures import suffix as figures
from app.figures.tree import tree_figure
from app.shared.session import RunSession
from app.tabs.generate import handlers
from app.tabs.generate.controls import TREE_CONTROLS, opening_value
from app.tabs.generate.views import round_views
from app.tabs.race.runs import PRESETS, race_options
from decoders import DecodeOptions, SuffixStore, generate

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
PROMPT = [3, 9, 4, 1, 7, 22, 5, 3, 9, 4, 1, 7]


@pytest.fixture(scope="module")
def run(tiny):
    store = SuffixStore()
    store.add(generate(DecodeOptions(max_new_tokens=30), PROMPT, target=tiny).output_ids)
    return generate(DecodeOptions(method="speculative", drafter="suffix", max_new_tokens=30), PROMPT, target=tiny,
                    store=store)


def test_the_round_views_draw_the_match_and_the_run(run):
    index = next(r.index for r in run.rounds if r.search and r.search["match_len"] and r.n_drafted >= 2)
    rnd = run.rounds[index]
    views = round_views(run, index)
    title = views["positions"].layout.title.text.replace("<br>", " ")
    n = rnd.search["match_len"]
    tail = "the last token" if n == 1 else f"the last {n} tokens"  # never "the last 1 tokens"
    assert f"{tail} occurred in {rnd.search['source']}" in title
    first = [e for e in rnd.search["pool"] if e["parent"] == -1]
    assert list(views["positions"].data[0].x) == [e["count"] for e in first][:figures.SHOWN_NEXT]  # as recorded
    tail = views["positions"].layout.annotations[0]
    assert tail.text.startswith("tail: ") and repr("".join(rnd.search["match_texts"])) in html.unescape(tail.hovertext)
    line = next(t for t in views["rounds"].data if t.name == "matched tail length")
    assert list(line.y) == [r.search["match_len"] for r in run.rounds if r.search]  # (a last round with no room: none)


def test_tree_nodes_say_their_counts_on_hover(run):
    rnd = next(r for r in run.rounds if r.n_drafted >= 2)
    figure = tree_figure(run, rnd.index)
    hovers = " ".join(h for trace in figure.data if trace.hovertext is not None for h in trace.hovertext)
    entry = rnd.search["pool"][0]
    assert f"followed its parent string {entry['count']} of the {entry['of']} times" in hovers
    assert "q: none (a deterministic draft" in hovers  # no made-up draft probability
    assert figure.layout.title.text.replace("<br>", " ").startswith(f"Round {rnd.index + 1}/{len(run.rounds)}: ")


def test_a_round_without_a_match_says_so(run):
    rnd = copy.deepcopy(run.rounds[0])
    rnd.search.update(match_len=0, match=[], cap=0)
    assert "no tail of the text occurred" in figures.headline(run, rnd)
    assert "no tail of the text occurred earlier" in figures.match_figure(
        type(run)(**{**run.__dict__, "rounds": [rnd]}), 0).layout.annotations[0].text.replace("<br>", " ")


def test_the_store_is_each_visitors_own_and_filled_once_per_finished_run(monkeypatch, run):
    seen = []

    def fake_decode(options, prompt, every, store=None):
        seen.append(store)
        yield run.to_dict()
        yield run.to_dict()  # the finished trace can come twice: remembered once

    monkeypatch.setattr(handlers, "decode_rounds", fake_decode)
    monkeypatch.setattr(handlers, "loaded", fake_loaded)
    values = {name: None for name in handlers.RUN_INPUTS}
    values.update({name: opening_value(name) for name in TREE_CONTROLS})  # number boxes refuse an empty value
    values.update(prompt="hello", model="smollm2-135m", method="speculative", drafter="suffix", max_new_tokens=8,
                  ngram=3, gamma=4, max_draft=6, top_k=0, seed=0, rule="static", controller="off")
    mine, theirs = RunSession(), RunSession()
    for _ in range(2):
        updates = list(handlers.run(*(values[n] for n in handlers.RUN_INPUTS), progress=lambda *a, **k: None,
                                    session=mine))
    assert seen[0] == SuffixStore().to_dict() and len(seen[1]["outputs"]) == 1  # the second run reads the first
    store = mine.earlier.stores["smollm2-135m"]  # one store per target model (the run's options name it)
    assert len(store.outputs) == 2 and store.outputs[0][0] == tuple(run.output_ids)
    assert theirs.earlier.stores == {}  # another visitor's session holds nothing of this one's
    shown = updates[-1]["store"]
    assert "2 outputs" in shown and f"{2 * len(run.output_ids)} tokens" in shown
    assert "Empty" in handlers.clear_store(mine) and mine.earlier.stores == {}
    values.update(drafter="prompt-lookup")
    list(handlers.run(*(values[n] for n in handlers.RUN_INPUTS), progress=lambda *a, **k: None, session=mine))
    assert seen[-1] is None  # another drafter gets no store


def test_the_race_races_suffix_decoding_without_a_store():
    name = next(n for n, preset in PRESETS.items() if preset.get("drafter") == "suffix")
    runs = race_options({"model": "smollm2-135m", "methods": [name], "max_new_tokens": 16})
    assert runs[1].drafter == "suffix" and runs[1].method == "speculative"


def test_the_race_verdict_says_a_copied_tree_costs_no_draft_forward():
    from app.tabs.race.verdicts import verdict

    row = {"label": "suffix", "method": "speculative", "tree": True, "draft_steps": 0.0, "gamma": 3.0, "c": 0.0,
           "tau": 2.5, "speedup": 1.6, "acceptance_rate": 0.7, "alpha": None}
    assert "each round copied a tree of 3.0 drafts from the text (no draft forward" in verdict(row)
    lost = verdict({**row, "tau": 1.05, "speedup": 0.8, "acceptance_rate": 0.1})
    assert "the drafts rarely survived (α = 0.10)" in lost and "expansion step" not in lost


def test_a_cost_controlled_round_says_what_it_sent_and_why(tiny, monkeypatch):
    """Controller "cost" on suffix decoding: a round that sent part of its candidates, or none, says so in the match
    panel's title, the rule panel's sentence and the hover of the candidates it held back (their calibrated chance).
    The verification curve is a steep made-up one (each extra token 0.3 of a step), so the price cuts some round."""
    from app.figures.rule import controller_sentence
    from decoders import registry

    monkeypatch.setattr(registry, "run_costs", lambda ctx, prompt_tokens=0: registry.RunCosts(
        t=lambda n: 1 + 0.3 * (n - 1), c=0.0))

    def priced(**more):
        return DecodeOptions(method="speculative", drafter="suffix", controller="cost", max_new_tokens=30, **more)

    trace = generate(priced(), PROMPT, target=tiny)
    cut = [r for r in trace.rounds if r.search and r.search.get("stop") == "cost"]
    assert cut, "no round was priced short of its candidates"
    rnd = cut[0]
    title = figures.headline(trace, rnd)
    decision = rnd.rule["controller"]
    assert decision["calibrated_by"] == "drafter"
    sentence = controller_sentence(rnd)
    if rnd.n_drafted:  # both panels count the candidates the price weighed
        assert f"the cost controller sent {rnd.n_drafted} of {decision['of']} candidates" in title
        assert sentence.startswith(f"sent {rnd.n_drafted} of the {decision['of']} copied candidates")
    else:
        assert "no draft sent: the cost controller found none worth its verification" in title
        assert sentence.startswith(f"sent none of the {decision['of']} copied candidates")
    held = rnd.search["pool"][rnd.n_drafted]
    assert any("calibrated chance the target accepts it" in line for line in figures.node_lines(held))
