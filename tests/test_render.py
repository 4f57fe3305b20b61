"""Render functions (app/render_*.py) on recorded and tiny-model traces: pure, no gradio server, no real weights."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from app.render_race import alpha_from_tau, expected_speedup, leviathan_figure, race_row, race_table_html
from app.render_rule import positions_figure, rounds_figure
from app.render_stats import stats_figure, stats_html, verdict_line
from app.render_text import provenance_spans, round_of_span
from app.render_tree import EXTRA, round_graph, tidy_layout, tree_figure
from app.views import interesting_round, read_trace_file
from decoders import DecodeOptions, Trace, generate
from decoders.trace import NodeRecord, RoundRecord

RECORDED = sorted((Path(__file__).parent.parent / "assets" / "traces").glob("*.json"))


@pytest.fixture(scope="module")
def tiny_traces(tiny, drafts):
    """Greedy and sampled runs on tiny models: accepted, rejected and not-reached nodes all occur."""
    runs = {
        "adaedl-sampled": DecodeOptions(method="speculative", rule="adaedl", max_new_tokens=40, temperature=1.0),
        "static-greedy": DecodeOptions(method="speculative", rule="static", gamma=5, max_new_tokens=30),
        "maxconf": DecodeOptions(method="speculative", rule="max-confidence", max_new_tokens=30, temperature=0.8),
        "baseline": DecodeOptions(max_new_tokens=12),
        "lookup": DecodeOptions(method="speculative", drafter="prompt-lookup", max_new_tokens=20),
    }
    return {name: generate(o, [1, 2, 3, 1, 2, 3, 1, 2], target=tiny, draft=drafts["noisy"])
            for name, o in runs.items()}


def all_traces(tiny_traces) -> list[Trace]:
    return list(tiny_traces.values()) + [read_trace_file(p) for p in RECORDED]


def figure_nodes(fig) -> dict[int, str]:
    """node id -> status, read back from the figure's node traces."""
    found = {}
    for data in fig.data:
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
    assert all(t.models["target"]["name"] == "smollm2-135m" for t in traces)


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


def test_benchmark_100_node_figure():
    rnd = _random_round(100, random.Random(0))
    trace = Trace(method="speculative", label="bench", options={"rule": "static", "gamma": 12}, models={},
                  precision="", prompt="", prompt_ids=[1], rounds=[rnd])
    start = time.perf_counter()
    fig = tree_figure(trace, 0)
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    fig.to_json()
    serialized = time.perf_counter() - start
    print(f"\n100-node tree figure: built in {elapsed * 1000:.1f} ms, serialized in {serialized * 1000:.1f} ms")
    assert len(figure_nodes(fig)) == 101


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
    if stop_round is not None:
        fig = positions_figure(ada, stop_round)
        assert any(d.name == "stop" for d in fig.data)
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
    assert "0 drafts accepted" in html and "title=" in html and "Precision" in html


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
    assert rows[0]["identical"] and rows[1]["c"] is not None and rows[1]["alpha"] is not None
    assert "same as baseline" in race_table_html(rows)
    fig = leviathan_figure(rows)
    assert any(d.mode == "markers" for d in fig.data)


def test_interesting_round_prefers_a_rejection(tiny_traces):
    trace = tiny_traces["adaedl-sampled"]
    rnd = trace.rounds[interesting_round(trace)]
    assert rnd.n_accepted < rnd.n_drafted or all(r.n_accepted == r.n_drafted for r in trace.rounds)
