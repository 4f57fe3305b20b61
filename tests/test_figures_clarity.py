"""Figure defects from issue 24: crowded sibling labels, unexplained token marks, overlapping corner ticks, raw
stop identifiers."""
from __future__ import annotations

from app.figures.search import run_figure
from app.figures.text import legend_html
from app.figures.tree import LABELLED_SIBLINGS, KEPT_STATUSES, node_labels, round_graph, tree_figure
from app.figures.search import pool_view
from app.shared.paths import ASSETS
from app.shared.theme import STOP_WORDS, stop_words
from app.tabs.generate.views import read_trace_file

TREE = read_trace_file(ASSETS / "traces" / "eagle2-head-chat.json")


def crowded_round():
    """A round where one parent has more rejected or unreached children than can be labelled."""
    for rnd in TREE.rounds:
        graph = round_graph(rnd)
        for parent in graph.nodes:
            crowd = [n for n in graph.successors(parent) if graph.nodes[n]["status"] not in KEPT_STATUSES + ("pool",)]
            if len(crowd) > LABELLED_SIBLINGS + 1:
                return rnd, graph, parent, crowd
    raise AssertionError("the recorded tree has no crowded parent to test with")


def test_a_crowd_of_rejected_siblings_shows_a_few_labels_and_a_count():
    rnd, graph, parent, crowd = crowded_round()
    labels = node_labels(graph, pool_view(rnd), 14)
    shown = [labels[n] for n in crowd if labels[n]]
    assert len(shown) == LABELLED_SIBLINGS + 1
    assert f"+{len(crowd) - LABELLED_SIBLINGS} more" in shown
    fig = tree_figure(TREE, rnd.index)
    drawn = [t for trace in fig.data if trace.mode == "markers+text" for t in trace.text]
    assert f"+{len(crowd) - LABELLED_SIBLINGS} more" in drawn


def test_the_path_the_target_kept_is_always_labelled():
    for rnd in TREE.rounds[:10]:
        graph = round_graph(rnd)
        labels = node_labels(graph, pool_view(rnd), 14)
        assert all(labels[n] for n in graph.nodes if graph.nodes[n]["status"] in ("accepted", "bonus", "resampled"))


def test_token_marks_are_explained():
    assert "␣ = a space" in legend_html() and "� = part of a multi-byte character" in legend_html()
    hovers = [h for trace in tree_figure(TREE, 0).data if trace.hovertext for h in trace.hovertext]
    spaced = [h for h in hovers if "' " in h.split("</b>")[0] or "&#x27; " in h.split("</b>")[0]]
    assert spaced and all("␣ = a space" in h for h in spaced)


def test_the_calibration_corner_ticks_do_not_meet():
    fig = run_figure(TREE, 0)
    assert fig.layout.yaxis.range[0] < 0 and fig.layout.xaxis.range[0] < -3  # both start before their first tick
    assert list(fig.layout.xaxis.ticktext) == ["0.001", "0.01", "0.1", "1"]


def test_stop_reasons_are_words():
    for reason in ("eos", "max_new_tokens", "cancelled", "context", "some_new_reason"):
        assert "_" not in stop_words(reason)
    assert stop_words("max_new_tokens") == STOP_WORDS["max_new_tokens"]


def test_the_trees_lesson_opens_on_a_round_where_the_tree_beats_the_chain():
    """Issue 24: the trees lesson opened on a round that accepted one token. It now opens on a round whose accepted
    path leaves the draft's top-1 chain and goes deeper than that chain would have."""
    from app.tabs.generate.views import chain_gain, tree_beats_chain_round
    from app.tabs.learn import lessons

    lesson = next(lesson for lesson in lessons.LESSONS if lesson.tab == "Trees")
    trace = lessons.lesson_trace(lesson)
    index = tree_beats_chain_round(trace)
    assert index is not None
    rnd = trace.rounds[index]
    depth, kept = chain_gain(rnd)
    assert kept >= 2 and kept > depth - 1  # deeper than the top-1 chain, which stops before `depth`
    children = {}
    for node in rnd.nodes:
        children.setdefault(node.parent, []).append(node)
    off_chain = next(n for n in rnd.nodes if n.status == "accepted" and n.depth == depth)
    assert max(children[off_chain.parent], key=lambda m: m.q).id != off_chain.id  # not the draft's first choice
    title = lessons.lesson_figure(lesson).layout.title.text
    assert title.startswith(f"Round {index + 1}/")
