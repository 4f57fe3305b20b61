"""The Beams tab's views on a hand-built trace: a 4-beam x 4-layer forest with every node in its place, colours by
status, survivors and finished beams marked; D[W] bars sum to 1 with the thres line; candidates ranked."""
from __future__ import annotations

import html

import pytest

from app.figures.forest import (FINISHED_COLOR, SURVIVOR_COLOR, beam_paths, candidates_html, forest_figure,
                               forest_layout, scores_figure, tail, width_figure)
from app.shared.theme import STATUS_COLORS
from decoders.beams.trace import BeamTrace, check


def node(id_, row, layer, token, parent, status, p=None, q=None):
    return {"id": id_, "row": row, "layer": layer, "token": token, "text": f"<{token}>" if token is not None else "",
            "parent": parent, "q": q, "p": p, "status": status, "u": None, "accept_prob": None}


def forest_nodes() -> list[dict]:
    """Four input beams (ids 0-3); each grows a chain over layers 1-4; beam 0 also drew a rejected token on layer 1
    and beam 3's chain stops being reached after layer 2. Listed layer by layer (parents first)."""
    nodes = [node(r, r, 0, None, -1, "root") for r in range(4)]
    chain = {r: r for r in range(4)}  # the last chain node per beam
    for layer in range(1, 5):
        for r in range(4):
            status = "not_reached" if r == 3 and layer > 2 else "accepted"
            new = node(len(nodes), r, layer, 10 * r + layer, chain[r], status, p=0.5, q=0.4)
            nodes.append(new)
            chain[r] = new["id"]
            if r == 0 and layer == 1:
                nodes.append(node(len(nodes), 0, 1, 99, 0, "rejected", q=0.3))
    return nodes


def forest_trace() -> BeamTrace:
    nodes = forest_nodes()
    iteration = {"index": 0, "nodes": nodes, "stopped_at": None,
                 "layers": [{"layer": 1, "width": 2, "distribution": [0.1, 0.2, 0.3, 0.4], "thres": 0.7,
                             "passed": True, "accepted": 2}],
                 "beams": [{"row": 0, "tokens": [1, 2, 3, 4], "score": -1.0},
                           {"row": 1, "tokens": [11, 12, 13, 14], "score": -2.0}],
                 "ended": [{"row": 2, "tokens": [21, 22], "score": -0.5}],
                 "finished": [[[21, 22], -0.25]], "kv_bytes": {"target": 1024, "draft": 512}, "target_rows": 2,
                 "target_forwards": 1, "draft_forwards": 4}
    trace = BeamTrace(method="dsbd", label="DSBD test", options={}, models={}, prompt="x", prompt_ids=[1],
                      iterations=[iteration],
                      candidates=[{"tokens": [21, 22], "text": "<21><22>", "score": -0.25},
                                  {"tokens": [1, 2], "text": "<1><2>", "score": -1.5}])
    check(trace)  # the hand-built forest satisfies the schema the decoder's traces do
    return trace


def test_layout_puts_every_node_of_the_4x4_forest_in_its_place():
    nodes = forest_nodes()
    pos = forest_layout(nodes)
    assert len(pos) == len(nodes) == 4 + 16 + 1
    for n in nodes:
        assert pos[n["id"]][0] == n["layer"]
    # tree 0: its chain on row 0, the rejected sibling on row 1, the root midway; then one gap row per tree
    rows = {r: {pos[n["id"]][1] for n in nodes if n["row"] == r and n["status"] != "rejected" and n["layer"] > 0}
            for r in range(4)}
    assert rows == {0: {0.0}, 1: {3.0}, 2: {5.0}, 3: {7.0}}
    rejected = next(n for n in nodes if n["status"] == "rejected")
    assert pos[rejected["id"]] == (1.0, 1.0) and pos[0] == (0.0, 0.5)
    assert [pos[r][1] for r in (1, 2, 3)] == [3.0, 5.0, 7.0]


def test_beam_paths_follow_tokens_from_their_root():
    nodes = forest_nodes()
    paths = beam_paths(nodes, [{"row": 1, "tokens": [11, 12]}, {"row": 0, "tokens": [99]}, {"row": 3, "tokens": [7]}])
    assert [nodes[i]["token"] for i in paths[0][1:]] == [11, 12] and paths[0][0] == 1
    assert nodes[paths[1][-1]]["status"] == "rejected"
    assert paths[2] == [3]  # no such token: the path stops at the root


def test_forest_colours_nodes_by_status_and_marks_survivors_and_finished():
    fig = forest_figure(forest_trace())
    marker_traces = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert set(marker_traces) == {"input beam", "accepted", "rejected", "not reached"}
    status_of = {"input beam": "root", "accepted": "accepted", "rejected": "rejected", "not reached": "not_reached"}
    nodes = forest_nodes()
    for name, tr in marker_traces.items():
        assert tr.marker.color == STATUS_COLORS[status_of[name]]
        assert sorted(tr.customdata) == sorted(n["id"] for n in nodes if n["status"] == status_of[name])
    accepted = marker_traces["accepted"]
    ends = {cid: (color, symbol) for cid, color, symbol in
            zip(accepted.customdata, accepted.marker.line.color, accepted.marker.symbol)}
    survivor_ends = [n["id"] for n in nodes if n["token"] in (4, 14)]
    finished_end = next(n["id"] for n in nodes if n["token"] == 22)
    assert all(ends[i][0] == SURVIVOR_COLOR for i in survivor_ends)
    assert ends[finished_end] == (FINISHED_COLOR, "square")
    assert sum(color in (SURVIVOR_COLOR, FINISHED_COLOR) for color, _ in ends.values()) == 3
    kept = next(t for t in fig.data if t.name == "beam carried forward")
    assert len(kept.x) == 3 * 8  # two beams of four edges, three entries (x0, x1, None) per edge
    hover = marker_traces["accepted"].hovertext[0]
    assert "p (target) = 0.500" in hover and "q (draft) = 0.400" in hover


def test_width_chart_bars_sum_to_one_with_the_thres_line_and_the_chosen_width():
    fig = width_figure(forest_trace())
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 1 and sum(bars[0].y) == pytest.approx(1.0)
    thres = next(t for t in fig.data if t.name.startswith("thres"))
    assert list(thres.y) == [0.7, 0.7]
    assert [c for c in bars[0].marker.color].index(SURVIVOR_COLOR) == 2
    assert tail([0.1, 0.2, 0.3, 0.4]) == pytest.approx([1.0, 0.9, 0.7, 0.4])


def test_candidates_are_ranked_and_scores_plotted():
    out = candidates_html(forest_trace())
    assert out.index('data-rank="1"') < out.index("&lt;21&gt;&lt;22&gt;") < out.index('data-rank="2"')
    assert "-0.250" in out
    fig = scores_figure(forest_trace())
    assert list(fig.data[0].y) == [-1.0, -2.0] and list(fig.data[1].y) == [-0.25]


def test_empty_views_say_so():
    """And say it to a screen reader too (layout.meta becomes the plot's aria-label; issue 35.8)."""
    for fig in (forest_figure(None), scores_figure(None), width_figure(None)):
        assert fig.layout.meta and fig.layout.meta.split(":")[0] in fig.layout.annotations[0].text.replace("<br>", " ")
    assert "Beam forest: none yet" in forest_figure(None).layout.annotations[0].text.replace("<br>", " ")
    assert "No finished" in candidates_html(None)
    assert "No DSBD layer yet" in width_figure(None).layout.annotations[0].text


@pytest.mark.parametrize("method", ["dsbd", "beam-sampling"])
def test_sampled_beam_scores_are_not_called_log_p_and_true_log_p_sits_beside_them(method):
    trace = forest_trace()
    trace.method = method
    trace.candidates[0]["logp"] = -3.5
    out = html.unescape(candidates_html(trace))
    assert "score (log of per-step draw probability)" in out and "not the sequence's log p" in out
    assert "log p (target)" in out and "-3.50" in out
    fig = scores_figure(trace)
    title = fig.layout.title.text.replace("<br>", " ")
    assert "log p" not in title.replace("log of per-step draw probability", "")
    assert "draw probability" in title and "not log p" in fig.layout.yaxis.title.text
    assert "renormalised" in fig.data[0].hovertemplate
    trace.iterations[0]["nodes"][5]["score"] = -0.7  # a beam-sampling-like node with a score and its log p
    trace.iterations[0]["nodes"][5]["logp"] = -2.1
    hovers = " ".join(h for t in forest_figure(trace).data if t.hovertext for h in t.hovertext)
    assert "score (log of per-step draw probability) = -0.7" in hovers and "log p (target, cumulative) = -2.1" in hovers
    assert "score (log p)" not in hovers


def test_beam_search_score_is_called_cumulative_log_p():
    trace = forest_trace()
    trace.method = "beam-search"
    assert "score (cumulative log p)" in candidates_html(trace)
    assert "cumulative log p" in scores_figure(trace).layout.title.text.replace("<br>", " ")


def test_width_panel_says_in_words_why_it_is_empty_for_beam_sampling():
    trace = forest_trace()
    trace.method = "beam-sampling"
    trace.iterations[0]["layers"] = []
    fig = width_figure(trace)
    assert not fig.data and "keep a fixed width" in fig.layout.annotations[0].text.replace("<br>", " ")


@pytest.mark.parametrize("reason, words", [("max_new_tokens", "reached the max new tokens"),
                                           ("eos", "finished at end-of-sequence"), ("cancelled", "stopped by the user")])
def test_summary_line_says_the_stop_reason_in_words(reason, words):
    from app.figures.forest import summary_line

    trace = forest_trace()
    trace.stop_reason = reason
    line = summary_line(trace)
    assert words in line and reason not in line.replace(words, "")


def test_a_dsbd_iteration_without_layers_says_why():
    trace = forest_trace()
    trace.iterations[0]["layers"] = []
    text = width_figure(trace, 0).layout.annotations[0].text.replace("<br>", " ")
    assert "drafted no layer" in text and "one token left" in text
