"""Render functions (app/render_*.py) on recorded and tiny-model traces: pure, no gradio server, no real weights."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from app.figures.race import RACE_CSS, alpha_from_tau, expected_speedup, leviathan_figure, race_row, race_table_html, \
    speed_figure
from app.figures.rule import positions_figure, rounds_figure
from app.figures.stats import stats_figure, stats_html, verdict_line
from app.figures.text import SMALL_MODELS_NOTE, display_groups, legend_html, provenance_spans, round_mark_css, \
    round_of_span, shown_pieces
from app.figures.tree import EXTRA, round_graph, tidy_layout, tree_figure
from app.shared.theme import PROVENANCE_COLORS, PROVENANCE_UNDERLINES, STATUS_SYMBOLS, provenance_css, rgba, sig
from app.tabs.generate.views import OPENING_TRACE, full_views, interesting_round, opening_trace, read_trace_file, recorded_traces, \
    shown_round
from decoders import DecodeOptions, Trace, generate
from decoders.trace import NodeRecord, RoundRecord

RECORDED = sorted((Path(__file__).parent.parent / "assets" / "traces").glob("*.json"))


@pytest.fixture(scope="module")
def tiny_traces(tiny, drafts):
    """Greedy and sampled runs on tiny models: accepted, rejected and not-reached nodes all occur."""
    runs = {
        "adaedl-sampled": DecodeOptions(method="speculative", rule="adaedl", max_new_tokens=40, temperature=1.0),
        "static-greedy": DecodeOptions(method="speculative", rule="static", gamma=5, max_new_tokens=30),
        "static-sampled": DecodeOptions(method="speculative", rule="static", gamma=5, max_new_tokens=30,
                                        temperature=1.0),
        "maxconf": DecodeOptions(method="speculative", rule="max-confidence", max_new_tokens=30, temperature=0.8),
        "baseline": DecodeOptions(max_new_tokens=12),
        "lookup": DecodeOptions(method="speculative", drafter="prompt-lookup", max_new_tokens=20),
    }
    return {name: generate(o, [1, 2, 3, 1, 2, 3, 1, 2], target=tiny, draft=drafts["noisy"])
            for name, o in runs.items()}


def all_traces(tiny_traces) -> list[Trace]:
    return list(tiny_traces.values()) + [read_trace_file(p) for p in RECORDED]


def figure_nodes(fig) -> dict[int, str]:
    """node id -> status, read back from the figure's node traces (a tree drafter's folded candidates, drawn as
    "+n" nodes, are checked in tests/test_render_search.py)."""
    found = {}
    for data in fig.data:
        if data.meta == "pool":
            continue
        for node_id, status in (data.customdata if data.customdata is not None else []):
            assert node_id not in found, f"node {node_id} drawn twice"
            found[int(node_id)] = status
    return found


def test_recorded_traces_exist_and_cover_the_cases():
    traces = [read_trace_file(p) for p in RECORDED]
    assert len(traces) >= 3
    assert any(t.method == "baseline" for t in traces)
    assert any((t.options or {}).get("rule") == "adaedl" for t in traces)
    assert any(n.status == "rejected" for t in traces for r in t.rounds for n in r.nodes)
    assert all(t.models["target"]["name"] in ("smollm2-135m", "qwen2.5-coder-1.5b") for t in traces)  # registry models


def test_every_node_appears_with_its_status(tiny_traces):
    for trace in all_traces(tiny_traces):
        for rnd in trace.rounds:
            drawn = figure_nodes(tree_figure(trace, rnd.index))
            expected = {n.id: n.status for n in rnd.nodes}
            extra = max(expected, default=0) + 1
            expected[extra] = rnd.bonus_source  # the target's own token, drawn as an extra node
            assert drawn == expected, f"{trace.label} round {rnd.index}"


def test_statuses_seen_include_rejected_and_not_reached(tiny_traces):
    statuses = {n.status for t in all_traces(tiny_traces) for r in t.rounds for n in r.nodes}
    assert {"root", "accepted", "rejected"} <= statuses


def test_bonus_node_hangs_off_the_last_accepted_node(tiny_traces):
    for trace in all_traces(tiny_traces):
        for rnd in trace.rounds:
            graph = round_graph(rnd)
            extra = [n for n in graph.nodes if graph.nodes[n].get(EXTRA)]
            assert len(extra) == 1
            parent = next(iter(graph.predecessors(extra[0])))
            assert graph.nodes[parent]["depth"] == rnd.n_accepted


def _random_round(n: int, rng: random.Random) -> RoundRecord:
    nodes = [NodeRecord(0, -1, 0, "r", 0, None, None, None, None, "root")]
    for i in range(1, n):
        parent = rng.randrange(max(0, i - 12), i)  # bushy and deep
        nodes.append(NodeRecord(i, parent, i, f"t{i}", nodes[parent].depth + 1, 0.5, 0.5, 1.0, 0.3,
                                rng.choice(["rejected", "not_reached"])))
    return RoundRecord(index=0, n_drafted=n - 1, n_accepted=0, committed=[7], provenance=["resampled"],
                       bonus_token=7, bonus_text="b", bonus_source="resampled", nodes=nodes)


def _segments_cross(a, b, c, d) -> bool:
    """Do segments ab and cd intersect anywhere other than a shared endpoint (touching or overlapping counts)?"""
    def orient(p, q, r):
        v = (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
        return 0 if abs(v) < 1e-12 else (1 if v > 0 else -1)

    def on_segment(p, q, r):  # r on pq, given collinear
        return min(p[0], q[0]) - 1e-12 <= r[0] <= max(p[0], q[0]) + 1e-12 and \
            min(p[1], q[1]) - 1e-12 <= r[1] <= max(p[1], q[1]) + 1e-12

    shared = {a, b} & {c, d}
    o1, o2, o3, o4 = orient(a, b, c), orient(a, b, d), orient(c, d, a), orient(c, d, b)
    if shared:  # edges meeting at a node cross only if they overlap (collinear, pointing the same way)
        if o1 == o2 == 0:
            other_ab = b if a in shared else a
            other_cd = d if c in shared else c
            s = next(iter(shared))
            return (other_ab[0] - s[0]) * (other_cd[0] - s[0]) + (other_ab[1] - s[1]) * (other_cd[1] - s[1]) > 0
        return False
    if o1 != o2 and o3 != o4:
        return True
    return any(o == 0 and on_segment(p, q, r) for o, p, q, r in
               ((o1, a, b, c), (o2, a, b, d), (o3, c, d, a), (o4, c, d, b)))


def count_crossings(graph, pos) -> int:
    edges = [(pos[u], pos[v]) for u, v in graph.edges]
    return sum(_segments_cross(*edges[i], *edges[j]) for i in range(len(edges)) for j in range(i + 1, len(edges)))


def test_crossing_check_detects_a_crossing():
    assert _segments_cross((0, 0), (1, 1), (0, 1), (1, 0))
    assert not _segments_cross((0, 0), (1, 0), (0, 1), (1, 1))
    assert _segments_cross((0, 0), (1, 0), (0, 0), (2, 0))  # overlapping from a shared node


@pytest.mark.parametrize("seed", range(6))
def test_layout_has_no_edge_crossings_on_random_trees(seed):
    rng = random.Random(seed)
    rnd = _random_round(rng.randrange(100, 160), rng)
    graph = round_graph(rnd)
    pos = tidy_layout(graph)
    assert set(pos) == set(graph.nodes)
    assert all(pos[n][0] == graph.nodes[n]["depth"] for n in graph.nodes)  # x = depth, left to right
    assert len(set(pos.values())) == len(pos)  # no two nodes on top of each other
    assert count_crossings(graph, pos) == 0


def test_a_naive_layered_layout_would_cross():
    """Sanity: the crossing check finds crossings in a layout that ignores the tree order."""
    rnd = _random_round(120, random.Random(3))
    graph = round_graph(rnd)
    rows: dict[int, int] = {}
    pos = {}
    for n in sorted(graph.nodes, key=lambda n: -n):  # reversed order per layer
        d = graph.nodes[n]["depth"]
        pos[n] = (float(d), float(rows.get(d, 0)))
        rows[d] = rows.get(d, 0) + 1
    assert count_crossings(graph, pos) > 0


def test_provenance_spans_concatenate_to_the_text(tiny_traces):
    for trace in all_traces(tiny_traces):
        spans = provenance_spans(trace)
        assert "".join(text for text, _ in spans) == trace.output_text
        assert [label for _, label in spans] == [t.provenance for t in trace.tokens]
        for i, token in enumerate(trace.tokens):
            assert round_of_span(trace, i) == token.round
        assert round_of_span(trace, len(spans)) is None


def test_rule_panels(tiny_traces):
    ada = tiny_traces["adaedl-sampled"]
    stop_round = next((r.index for r in ada.rounds if any(c.get("stop") for c in (r.rule or {}).get("checks", []))),
                      None)
    assert stop_round is not None, "the fixture run must contain a round the rule stopped"
    fig = positions_figure(ada, stop_round)
    assert "stop" in {d.name for d in fig.data}
    fig = rounds_figure(ada)
    names = {d.name for d in fig.data}
    assert {"λ after the round", "running acceptance AR", "drafted", "accepted"} <= names
    assert len(positions_figure(tiny_traces["static-greedy"]).data) == 0  # explained, not drawn
    assert any("max q" in (d.name or "") for d in positions_figure(tiny_traces["maxconf"], 0).data)


def test_every_plot_trace_explains_itself_on_hover(tiny_traces):
    ada = tiny_traces["adaedl-sampled"]
    figures = [tree_figure(ada, 1), positions_figure(ada, 1), rounds_figure(ada), stats_figure(ada)]
    for fig in figures:
        for data in fig.data:
            if data.hoverinfo == "skip":
                continue
            assert data.hovertemplate, f"{data.name} has no hover text"


def test_stats_say_when_speculation_did_nothing(tiny, drafts):
    trace = generate(DecodeOptions(method="speculative", rule="static", gamma=3, max_new_tokens=12),
                     [5, 9, 2], target=tiny, draft=drafts["unrelated"])
    for rnd in trace.rounds:  # make sure the case is exercised even if the unrelated draft got lucky
        rnd.n_accepted = 0
    trace.totals = {}
    line = verdict_line(trace)
    assert "0 drafts accepted" in line
    html = stats_html(trace)
    assert "0 drafts accepted" in html
    assert 'class="sl-card" title="' in html
    assert "Precision" in html


def test_stats_cards_have_hover_help(tiny_traces):
    html = stats_html(tiny_traces["adaedl-sampled"])
    assert html.count('class="sl-card" title="') == 8


def test_leviathan_formula():
    assert expected_speedup(0.0, 4, 0.0) == pytest.approx(1.0)
    assert expected_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert expected_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert expected_speedup(0.8, 4, 0.5) < expected_speedup(0.8, 4, 0.1)
    for alpha in (0.1, 0.5, 0.9):
        tau = expected_speedup(alpha, 3, 0.0)
        assert alpha_from_tau(tau, 3) == pytest.approx(alpha, abs=1e-6)


def test_race_views(tiny_traces):
    base, spec = tiny_traces["baseline"], tiny_traces["static-greedy"]
    rows = [race_row(base, base), race_row(spec, base)]
    assert rows[0]["identical"]
    assert rows[1]["c"] is not None
    assert rows[1]["alpha"] is not None
    assert "same as baseline" in race_table_html(rows)
    fig = leviathan_figure(rows)
    assert any(d.mode == "markers" for d in fig.data)


def test_interesting_round_prefers_a_rejection(tiny_traces):
    trace = tiny_traces["adaedl-sampled"]
    assert any(r.n_accepted < r.n_drafted for r in trace.rounds), "the fixture run must reject somewhere"
    rnd = trace.rounds[interesting_round(trace)]
    assert rnd.n_accepted < rnd.n_drafted


def test_interesting_round_without_rejections_is_the_best_accepting_one():
    rounds = [RoundRecord(index=i, n_drafted=n, n_accepted=n, committed=[1] * (n + 1),
                          provenance=["accepted"] * n + ["bonus"], bonus_token=1, bonus_text="x",
                          bonus_source="bonus") for i, n in enumerate([1, 3, 2])]
    trace = Trace(method="speculative", label="all accepted", options={}, models={}, precision="", prompt="",
                  prompt_ids=[1], rounds=rounds)
    assert interesting_round(trace) == 1


# ---- honest tooltips (issue 10 #4) ---------------------------------------------------------------------------

def hovers_by_status(fig) -> dict[str, list[str]]:
    """status -> the hover texts of the tree's nodes with that status."""
    found: dict[str, list[str]] = {}
    for data in fig.data:
        if data.meta:
            found.setdefault(data.meta, []).extend(data.hovertext)
    return found


def all_hovers(trace: Trace) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for rnd in trace.rounds:
        for status, texts in hovers_by_status(tree_figure(trace, rnd.index)).items():
            merged.setdefault(status, []).extend(texts)
    return merged


def test_greedy_tooltips_show_the_argmax_decision_not_a_probability(tiny_traces):
    hovers = all_hovers(tiny_traces["static-greedy"])
    judged = hovers["accepted"] + hovers["rejected"]
    assert hovers["rejected"], "the fixture run must reject a draft"
    for text in judged:
        assert "greedy decision: accept iff the target's argmax is this token" in text
        assert "min(1, p/q)" not in text
    for text in hovers["rejected"]:
        assert "→ reject" in text
    for text in hovers["resampled"]:
        assert "the target's argmax" in text
        assert "drawn from the residual" not in text


def test_sampled_tooltips_show_the_test_and_never_claim_greedy(tiny_traces):
    hovers = all_hovers(tiny_traces["static-sampled"])
    assert hovers.get("not_reached"), "the fixture run must leave a draft unreached"
    for text in hovers["not_reached"]:
        assert "greedy" not in text
        assert "no acceptance test ran on it" in text  # issue 47.8: its p is shown, so never "never judged"
        assert "never judged" not in text and "from the same verification forward" in text
    for text in hovers["accepted"] + hovers["rejected"]:
        assert "acceptance prob" in text
        assert "uniform draw u = " in text
    for text in hovers.get("resampled", []):
        assert "drawn from the residual" in text


def test_small_probabilities_keep_significant_digits():
    nodes = [NodeRecord(0, -1, 5, "a", 0, None, None, None, None, "root"),
             NodeRecord(1, 0, 6, "b", 1, 0.5, 1.2e-5, 2.4e-5, 0.3, "rejected")]
    rnd = RoundRecord(index=0, n_drafted=1, n_accepted=0, committed=[7], provenance=["resampled"], bonus_token=7,
                      bonus_text="c", bonus_source="resampled", nodes=nodes)
    trace = Trace(method="speculative", label="t", options={"temperature": 1.0, "rule": "static", "gamma": 1},
                  models={}, precision="", prompt="", prompt_ids=[1], rounds=[rnd])
    text = hovers_by_status(tree_figure(trace, 0))["rejected"][0]
    assert "p (target prob after its parent) = 1.20e-05" in text
    assert "= 2.40e-05" in text
    assert "0.000" not in text
    assert [sig(v) for v in (0.0432, 0.5, 0.00012, 0.0)] == ["0.0432", "0.500", "1.20e-04", "0"]


# ---- split UTF-8 characters (issue 10 #6) -------------------------------------------------------------------

@pytest.fixture(scope="module")
def emoji_trace():
    """A trace whose tokens come from smollm2's real tokenizer on emoji and CJK text (tokenizer only, no weights),
    with per-token texts made by the recorder's own detokenizer."""
    from decoders.runtime.models import load_tokenizer
    from decoders.recorder import Detokenizer
    from decoders.trace import TokenRecord

    tokenizer = load_tokenizer("smollm2-135m").tokenizer
    ids = tokenizer.encode("Hi 😀 你好 🎉 ok", add_special_tokens=False)
    detok = Detokenizer(lambda chunk: tokenizer.decode(chunk))
    kinds = ("accepted", "bonus", "resampled")
    tokens = [TokenRecord(i, detok.push(i), kinds[n % 3], n // 2) for n, i in enumerate(ids)]
    return Trace(method="speculative", label="emoji", options={}, models={}, precision="", prompt="",
                 prompt_ids=[1], output_ids=ids, output_text="".join(t.text for t in tokens), tokens=tokens)


def test_split_characters_show_whole_and_stay_clickable(emoji_trace):
    assert any(t.text == "" for t in emoji_trace.tokens), "the tokenizer must split a character for this test"
    spans = provenance_spans(emoji_trace)
    assert "".join(text for text, _ in spans) == emoji_trace.output_text
    assert all(shown_pieces(text) >= 1 for text, _ in spans)  # every span draws something to click
    assert [text for text, _ in spans if "😀" in text] == [" 😀"]
    groups = display_groups(emoji_trace)
    assert sorted(i for g in groups for i in g) == list(range(len(emoji_trace.tokens)))
    for span, group in enumerate(groups):
        completing = emoji_trace.tokens[group[-1]]
        assert round_of_span(emoji_trace, span) == completing.round
        assert spans[span][1] == completing.provenance
    assert round_of_span(emoji_trace, len(spans)) is None


# ---- the first page (issue 10 #3, #10) ----------------------------------------------------------------------

def test_page_opens_on_a_tree_that_accepts_drafts():
    """Issue 12: the first page a visitor sees shows a tree, not a chain, and one that gets drafts accepted.
    Issue 24: one where drafting pays (τ ≥ 3). Issue 47.1: one that is faster than the baseline recorded beside it
    at a glance (it read 1.10× before), opened on the round that shows why: where the tree beats a chain of the
    draft's first choices, else the round that kept the most drafts for one target forward."""
    from app.tabs.generate.controls import OPENING_BASELINE
    from app.tabs.generate.views import chain_gain, most_accepted_round, tree_beats_chain_round
    from decoders.registry import DRAFTERS, Family

    recorded = recorded_traces(RECORDED[0].parent)
    path = recorded[opening_trace(recorded)]
    assert path.name == OPENING_TRACE
    trace = read_trace_file(path)
    assert DRAFTERS[(trace.options or {}).get("drafter")].family == Family.TREE
    assert trace.totals["tau"] >= 3  # three or more tokens per target forward
    baseline = read_trace_file(path.with_name(OPENING_BASELINE))
    assert trace.totals["tokens_per_second"] >= 1.5 * baseline.totals["tokens_per_second"]
    shown = full_views(trace)
    assert SMALL_MODELS_NOTE in shown["legend"]
    index = tree_beats_chain_round(trace)
    if index is None:
        index = most_accepted_round(trace)
        assert trace.rounds[index].n_accepted >= 4  # several tokens for one target forward, at first sight
    else:
        assert chain_gain(trace.rounds[index])[1] >= 2
    assert shown_round(trace) == index


def test_opening_page_shows_one_round_everywhere():
    """The slider, the tree, the rule panels and the text's round mark all show the same round."""
    from app.page import build_demo

    demo = build_demo()
    blocks = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    trace = read_trace_file(RECORDED[0].parent / OPENING_TRACE)
    shown = shown_round(trace)
    views = full_views(trace)
    assert blocks["sl-round"].value == shown + 1
    assert views["slider"]["value"] == shown + 1
    assert views["tree"].layout.title.text.startswith(f"Round {shown + 1}/")
    assert f"round {shown + 1}'s tokens" in blocks["sl-legend"].value


# ---- accessibility (issue 10 #12) ----------------------------------------------------------------------------

MACHADO_2009 = {  # simulated dichromacy in linear RGB, severity 1.0 (Machado, Oliveira & Fernandes 2009)
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                   [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                     [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                   [0.004733, 0.691367, 0.303900]],
}


def _seen_lab(hex_color: str, vision: str | None, alpha: float = 0.5):
    """CIELAB of a colour as drawn behind the text (alpha over white), as seen with the given dichromacy."""
    import numpy as np

    rgb = np.array([alpha * int(hex_color[i:i + 2], 16) / 255 + (1 - alpha) for i in (1, 3, 5)])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    if vision:
        linear = np.clip(np.array(MACHADO_2009[vision]) @ linear, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = np.cbrt(np.maximum(xyz / np.array([0.95047, 1.0, 1.08883]), 0.008856))
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_provenance_colours_stay_apart_for_colour_blind_readers():
    import itertools

    import numpy as np

    for a, b in itertools.combinations(PROVENANCE_COLORS, 2):
        for vision in (None, *MACHADO_2009):
            gap = float(np.linalg.norm(_seen_lab(PROVENANCE_COLORS[a], vision) - _seen_lab(PROVENANCE_COLORS[b],
                                                                                            vision)))
            floor = 20 if {a, b} == {"accepted", "resampled"} else 11  # the pair issue 10 names: green vs orange
            assert gap >= floor, f"{a} vs {b} under {vision or 'normal vision'}: ΔE {gap:.1f}"


def test_provenance_has_a_second_channel_besides_colour():
    assert set(PROVENANCE_UNDERLINES) == set(PROVENANCE_COLORS)
    assert len(set(PROVENANCE_UNDERLINES.values())) == len(PROVENANCE_UNDERLINES)  # four different underlines
    css = provenance_css()
    for name, color in PROVENANCE_COLORS.items():  # keyed on the background Gradio writes for the category
        assert f'.token[style*="{rgba(color, 0.5)}"] {{ text-decoration: underline {PROVENANCE_UNDERLINES[name]}' \
            in css
    assert len({STATUS_SYMBOLS[s] for s in ("accepted", "rejected", "not_reached", "bonus", "resampled")}) == 5


def expand_to_elements(trace: Trace) -> list[int]:
    """Model of what Gradio draws: per token element, the index of the span it belongs to."""
    return [span for span, (text, _) in enumerate(provenance_spans(trace)) for _ in range(shown_pieces(text))]


def test_shown_round_is_marked_in_the_text(tiny_traces):
    import re

    trace = read_trace_file(RECORDED[0].parent / "lookup-code-edit.json")  # code: its output has line breaks
    assert any("\n" in text for text, _ in provenance_spans(trace))  # line breaks shift the element count
    owner = expand_to_elements(trace)
    groups = display_groups(trace)
    for index in range(len(trace.rounds)):
        css = round_mark_css(trace, index)
        marked = [int(k) - 1 for k in re.findall(r"nth-child\((\d+) of \.token-container\)", css)]
        expected = [e for e, span in enumerate(owner) if any(trace.tokens[i].round == index for i in groups[span])]
        assert marked == expected, f"round {index}"
        assert bool(expected) == (f"round {index + 1}'s tokens" in legend_html(trace, index))


def test_every_figure_has_a_text_alternative(tiny_traces):
    ada = tiny_traces["adaedl-sampled"]
    base, spec = tiny_traces["baseline"], tiny_traces["static-greedy"]
    rows = [race_row(base, base), race_row(spec, base)]
    figures = {"tree": tree_figure(ada, 1), "positions": positions_figure(ada, 1), "rounds": rounds_figure(ada, 1),
               "stats": stats_figure(ada), "speed": speed_figure(rows), "curve": leviathan_figure(rows),
               "empty": positions_figure(spec)}
    for name, fig in figures.items():
        assert isinstance(fig.layout.meta, str) and len(fig.layout.meta) > 20, name
    assert figures["tree"].layout.meta.startswith("Round 2/")
    assert "Round 2" in figures["positions"].layout.meta
    assert "Round 2 is marked" in figures["rounds"].layout.meta
    assert "speedup" not in figures["speed"].layout.meta or "×" in figures["speed"].layout.meta


# ---- fits a phone, polish at 1280 px (issue 10 #11, #14) -------------------------------------------------------

TITLE_CHARS = 44  # about 330 px of 14 px type: inside a plot on a 420 px screen


def test_plot_titles_and_empty_states_fit_a_narrow_plot(tiny_traces):
    ada, static = tiny_traces["adaedl-sampled"], tiny_traces["static-greedy"]
    base = tiny_traces["baseline"]
    rows = [race_row(base, base), race_row(static, base)]
    figures = [tree_figure(ada, 1), positions_figure(ada, 1), rounds_figure(ada), speed_figure(rows),
               leviathan_figure(rows), positions_figure(static), rounds_figure(base), tree_figure(ada, 0)]
    for trace in all_traces(tiny_traces):
        figures += [tree_figure(trace, r.index) for r in trace.rounds[:3]]
    for fig in figures:
        texts = [fig.layout.title.text or ""] + [a.text for a in fig.layout.annotations]
        for text in texts:
            for line in text.split("<br>"):
                assert len(line) <= TITLE_CHARS + 12, line  # the formula line is allowed a little more
                if "S(α, γ, c)" not in line:
                    assert len(line) <= TITLE_CHARS, line


def test_stats_chart_has_axis_titles_and_a_time_legend(tiny_traces):
    fig = stats_figure(tiny_traces["adaedl-sampled"])
    layout = fig.layout
    assert layout.xaxis.title.text and layout.yaxis.title.text
    assert layout.xaxis2.title.text and layout.yaxis2.title.text
    assert layout.xaxis3.title.text == "seconds"
    time_bars = [d for d in fig.data if d.orientation == "h"]
    assert [d.name for d in time_bars] == ["draft", "verify", "bookkeeping"]
    assert layout.showlegend and all(d.showlegend is not False for d in time_bars)
    assert all(d.showlegend is False for d in fig.data if d.orientation != "h")
    assert len({d.marker.pattern.shape for d in time_bars}) == 3  # the parts differ without colour too
    domains = [layout.yaxis.domain, layout.yaxis2.domain, layout.yaxis3.domain]
    assert domains[0][0] > domains[1][1] > domains[1][0] > domains[2][1]  # stacked, one per row


def test_race_table_scrolls_inside_its_box_with_a_cue(tiny_traces):
    from app.shared.theme import SCROLL_CSS

    base = tiny_traces["baseline"]
    table = race_table_html([race_row(base, base)])
    assert table.startswith('<div class="sl-scroll"><div class="sl-scroll-cue"') and 'class="sl-scroll-x"' in table
    assert ".sl-scroll-x { overflow-x: auto;" in SCROLL_CSS and ".sl-scroll[data-overflows] .sl-scroll-cue" in SCROLL_CSS


def test_race_row_shows_the_median_and_the_range_of_the_timed_runs(tiny_traces):
    from app.tabs.race.runs import median_run

    from decoders.trace import Trace

    runs = [Trace.from_dict(tiny_traces["maxconf"].to_dict()) for _ in range(3)]
    for run, speed in zip(runs, (20.0, 40.0, 10.0)):
        run.totals = {**run.totals, "tokens_per_second": speed}
    chosen = median_run(runs)
    assert chosen is runs[0]  # the middle speed, not the fastest
    row = race_row(chosen, None)
    speeds = chosen.totals["timed_tokens_per_second"]
    assert row["spread"] == (min(speeds), max(speeds)) and row["timed_runs"] == 3
    assert f"{row['tokens_per_second']:.1f} ({min(speeds):.1f}–{max(speeds):.1f})" in race_table_html([row])
