"""One round's draft tree as an interactive plotly figure (pure: trace in, figure out; no torch, no models).

networkx holds the graph; the layout is a tidy left-to-right layered drawing: x = depth, every leaf gets the next
row in depth-first order (siblings ordered by node id, so the order is the same every round), and a parent sits
centred on its first and last child. Subtrees occupy disjoint row intervals, so no two edges cross.

The token the target added itself (bonus after a fully accepted path, or the resampled token after a rejection)
is drawn as an extra node hanging off the last accepted node.

A tree drafter's round (EAGLE-2, DDD) also carries its search: the drafts that were never sent fold into one grey
"+n candidates" node under their nearest sent ancestor (hover lists the best of them), and the sent drafts the
target never reached are filled by their value (the product of draft probabilities on the path, log scale).
"""
from __future__ import annotations

import html
import math

import networkx as nx
import plotly.graph_objects as go

from decoders.trace import RoundRecord, Trace

from app.figures import suffix
from app.figures.retokenize import pieces_lines
from app.figures.search import PoolView, pool_view, search_headline
from app.shared.words import counted
from app.shared.theme import STATUS_COLORS, STATUS_LABELS, STATUS_SYMBOLS, describe, empty_figure, legend_below, \
    marks_in, sig, title_margin, visible_token, wrap_title

EXTRA = "extra"  # the graph attribute marking the target's own token
UNSENT = "unsent"  # the graph attribute holding the pool entries a "+n candidates" node folds
ROW_GAP = 1.0
POOL_COLOR = "#dedede"
VALUE_SCALE = "Blues"  # log10(value) from 0.001 (light) to 1 (dark)
LARGE = 30  # nodes from which labels shrink and move beside their markers
# The x range is this round's own (the deepest column it drew), so a round's columns get the whole width. A phone's
# plot is ~340 px wide: a column then has (340 / columns) px, and a label beside its marker must fit in it or it runs
# into the next column's nodes (issue 35.6), so labels are cut to what a column holds (the hover has the whole token).
PHONE_PLOT_PX = 340
CHAR_PX = {10: 6.0, 13: 7.5}  # mean width of a label character at the two label sizes
RIGHT_LABEL_ROOM = 1.4  # x units right of the deepest column for labels drawn beside their markers


def round_graph(rnd: RoundRecord) -> nx.DiGraph:
    """Nodes of one round plus the target's own token (id = len(nodes)), edges parent -> child."""
    graph = nx.DiGraph()
    nodes = rnd.nodes or []
    for node in nodes:
        graph.add_node(node.id, status=node.status, text=node.text, depth=node.depth, record=node)
        if node.parent >= 0:
            graph.add_edge(node.parent, node.id)
    if not nodes:  # recorded without nodes (record=False): the root alone
        graph.add_node(0, status="root", text="", depth=0, record=None)
    anchor = _last_accepted(graph)
    extra = max(graph.nodes) + 1
    status = rnd.bonus_source if rnd.bonus_source in STATUS_COLORS else "bonus"
    graph.add_node(extra, status=status, text=rnd.bonus_text, depth=graph.nodes[anchor]["depth"] + 1,
                   record=None, **{EXTRA: True})
    graph.add_edge(anchor, extra)
    _add_unsent(graph, rnd)
    return graph


def _add_unsent(graph: nx.DiGraph, rnd: RoundRecord) -> None:
    """One grey node per sent node whose pool candidates were not sent (tree drafters only)."""
    view = pool_view(rnd)
    if view is None:
        return
    for node in sorted(view.unsent):
        if node not in graph:
            continue
        entries = view.unsent[node]
        fold = max(graph.nodes) + 1
        graph.add_node(fold, status="pool", text=f"+{len(entries)}", depth=graph.nodes[node]["depth"] + 1,
                       record=None, **{UNSENT: entries})
        graph.add_edge(node, fold)


def _last_accepted(graph: nx.DiGraph) -> int:
    """The deepest node on the accepted path (the root if nothing was accepted)."""
    node = 0
    while True:
        nxt = [c for c in sorted(graph.successors(node)) if graph.nodes[c]["status"] == "accepted"]
        if not nxt:
            return node
        node = nxt[0]


def tidy_layout(graph: nx.DiGraph, root: int = 0) -> dict[int, tuple[float, float]]:
    """Left-to-right layered layout: (x, y) = (depth, row). Iterative, O(n); children in sorted id order."""
    pos: dict[int, tuple[float, float]] = {}
    next_row = 0.0
    depth = {root: 0}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        children = sorted(graph.successors(node))
        if not done:
            stack.append((node, True))
            for child in reversed(children):
                depth[child] = depth[node] + 1
                stack.append((child, False))
            continue
        if children:
            y = (pos[children[0]][1] + pos[children[-1]][1]) / 2
        else:
            y, next_row = next_row, next_row + ROW_GAP
        pos[node] = (float(depth[node]), y)
    return pos


def _checks_by_position(rnd: RoundRecord) -> dict[int, dict]:
    rule = rnd.rule or {}
    return {int(c.get("position", 0)): c for c in rule.get("checks", []) or []}


def _is_greedy(trace: Trace) -> bool:
    """Temperature 0: acceptance is argmax matching and the target's own token is its argmax (no draws)."""
    return float((trace.options or {}).get("temperature", 0.0) or 0.0) == 0.0


def _own_token_line(status: str, greedy: bool) -> str:
    """Where the target's own token came from; at temperature 0 nothing is drawn, it is the target's argmax."""
    if status == "baseline":
        return "a plain target step (no draft this round)" + (": the target's argmax" if greedy else "")
    if greedy:
        return {"bonus": "the target's argmax after every draft on the path was accepted",
                "resampled": "the target's argmax at the rejected position (greedy: no residual, no draw)"}[status]
    return {"bonus": "drawn from the target's p after every draft on the path was accepted",
            "resampled": "drawn from the residual norm(max(p − q, 0)) after a rejection"}[status]


def _draft_lines(graph: nx.DiGraph, node: int, rnd: RoundRecord, greedy: bool) -> list[str]:
    """q, p and the acceptance test of one drafted node, labelled by what the trace says was done."""
    record = graph.nodes[node]["record"]
    lines = [f"q (draft prob of this token) = {sig(record.q)}" if record.q is not None else
             "q: none (a deterministic draft, e.g. copied by prompt lookup: q(x) = 1)",
             f"p (target prob after its parent) = {sig(record.p)}"]
    if greedy:
        lines.append("(greedy: q and p are softmax at temperature 1, for reference; only the argmax decides)")
    if record.status == "not_reached":  # its p came out of the same forward; no acceptance test ran on it
        lines[1] = (f"p (target prob after its parent, from the same verification forward) = {sig(record.p)}"
                    if record.p is not None else "p: none (the verification forward gave none for it)")
        lines.append("not reached: a draft above it was rejected, so no acceptance test ran on it")
        return lines
    if record.accept_prob is None:
        return lines
    if greedy:
        verdict = "accept" if record.status == "accepted" else "reject"
        lines.append(f"greedy decision: accept iff the target's argmax is this token → {verdict}")
        if record.status == "rejected" and rnd.bonus_source == "resampled" and _parent_is_anchor(graph, node):
            lines.append(f"the target's argmax here: {html.escape(repr(rnd.bonus_text))}")
        return lines
    after_sibling = any(graph.nodes[s]["status"] == "rejected" for s in graph.successors(record.parent) if s < node)
    formula = "min(1, r/q′) against the residual left by a rejected sibling" if after_sibling else "min(1, p/q)"
    lines.append(f"acceptance prob {formula} = {sig(record.accept_prob)}")
    if record.uniform is not None:
        verdict = "accepted" if record.status == "accepted" else "rejected"
        lines.append(f"uniform draw u = {sig(record.uniform)} → {verdict} (accept iff u < the acceptance prob)")
    return lines


def _parent_is_anchor(graph: nx.DiGraph, node: int) -> bool:
    """Is this node a child of the last accepted node (where the target put its own token)?"""
    return graph.nodes[node]["record"].parent == _last_accepted(graph)


def _hover(graph: nx.DiGraph, node: int, rnd: RoundRecord, checks: dict[int, dict], greedy: bool,
           view: PoolView | None = None) -> str:
    data = graph.nodes[node]
    status = data["status"]
    token = html.escape(repr(data["text"]))
    lines = [f"<b>{token}</b>  ({STATUS_LABELS.get(status, status)})"]
    if status == "root":
        lines.append("the pending token: already committed, the target scores its children")
    elif data.get(EXTRA):
        lines.append(f"the target's own token: {_own_token_line(status, greedy)}")
    elif data.get("record") is not None:
        lines += _draft_lines(graph, node, rnd, greedy) + pieces_lines(rnd, node)
        lines += _value_lines(view, node)
        lines += _rule_lines(checks.get(data["depth"]))
    meaning = marks_in(visible_token(data["text"], 10 ** 6))
    if meaning:  # the label's ␣, ↵ or � explained where the reader meets it
        lines.append(f"label: {meaning}")
    lines.append(f"depth {data['depth']} · node {node}")
    return "<br>".join(lines)


def _value_lines(view: PoolView | None, node: int) -> list[str]:
    """A tree drafter's value of this node: what EAGLE-2 ranks by, and its rank in the pool."""
    entry = view.entry.get(node) if view is not None else None
    if entry is None:
        return []
    if "count" in entry:  # suffix decoding: counted, not drafted by a model
        return suffix.node_lines(entry)
    return [f"value = product of draft probs on the path = {sig(entry['value'])} "
            f"(rank {view.rank[int(entry['id'])]} of {counted(view.size, 'candidate')}; grown at step {entry['step']})"]


def _rule_lines(check: dict | None) -> list[str]:
    """The draft-length rule's numbers at this node's depth (AdaEDL's entropy, max-confidence's max q)."""
    if not check:
        return []
    lines = []
    if check.get("entropy") is not None:
        lines.append(f"draft entropy H = {sig(check['entropy'])} nats")
    if check.get("confidence") is not None:
        lines.append(f"draft confidence max q = {sig(check['confidence'])}")
    if check.get("bound") is not None:
        lines.append(f"rule bound = {sig(check['bound'])} vs λ = {sig(check.get('lam'))}")
    return lines


def tree_height(trace: Trace) -> int:
    """One height for the whole run (from its widest round), so the page does not jump while scrubbing; a tree
    drafter's rows (60 drafts and their folded candidates) get less room each, and plotly zooms."""
    if any(r.search for r in trace.rounds):
        rows = max((_leaves(round_graph(r)) for r in trace.rounds if r.search), default=1)
        return max(360, min(1000, 150 + 15 * rows))
    widest = max((sum(1 for n in r.nodes if not any(m.parent == n.id for m in r.nodes)) for r in trace.rounds),
                 default=1)
    return max(260, min(640, 190 + 55 * (widest + 1)))


def _leaves(graph: nx.DiGraph) -> int:
    return sum(1 for n in graph.nodes if graph.out_degree(n) == 0)


def tree_figure(trace: Trace, index: int | None = None, height: int | None = None) -> go.Figure:
    """The draft tree of round `index` (default: the last round)."""
    height = height or tree_height(trace)
    if not trace.rounds:
        return empty_figure("No rounds yet: press Run, or load a recorded trace.", height)
    index = len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))
    rnd = trace.rounds[index]
    graph = round_graph(rnd)
    pos = tidy_layout(graph)
    checks = _checks_by_position(rnd)
    greedy = _is_greedy(trace)
    view = pool_view(rnd)
    fig = go.Figure()
    _add_edges(fig, graph, pos)
    large = graph.number_of_nodes() > LARGE
    extent = max(x for x, _ in pos.values())  # this round's deepest column (the target's own token, a "+n" fold)
    labels = node_labels(graph, view, label_limit(extent, large))
    for status in STATUS_COLORS:
        ids = [n for n in graph.nodes if graph.nodes[n]["status"] == status]
        if ids:
            hovers = [_hover(graph, n, rnd, checks, greedy, view) for n in ids]
            _add_nodes(fig, graph, pos, ids, status, hovers, large, view, labels)
    _add_unsent_nodes(fig, graph, pos, view, large)
    rows = max(y for _, y in pos.values())
    title = wrap_title(_title(trace, rnd))
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=height, showlegend=True,
        legend=legend_below(),
        margin=dict(l=10, r=10, t=title_margin(title), b=10),
        hovermode="closest", plot_bgcolor="white", dragmode="pan",
        xaxis=dict(range=[-0.6, extent + (RIGHT_LABEL_ROOM if large else 0.6)], showgrid=False, zeroline=False,
                   tickvals=list(range(int(extent) + 1)), showticklabels=True, ticks="outside", ticklen=3,
                   tickfont=dict(size=10, color="#888"), title=dict(text="depth (tokens after the pending one)",
                                                                    font=dict(size=11, color="#666"))),
        yaxis=dict(range=[rows + 0.8, -0.8], showgrid=False, zeroline=False, showticklabels=False),
    )
    return describe(fig, tree_summary(trace, rnd, graph))


def _add_unsent_nodes(fig: go.Figure, graph: nx.DiGraph, pos: dict, view: PoolView | None, large: bool) -> None:
    ids = [n for n in graph.nodes if graph.nodes[n]["status"] == "pool"]
    if not ids or view is None:
        return
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in ids], y=[pos[n][1] for n in ids], mode="markers+text", name="candidates not sent",
        text=[graph.nodes[n]["text"] for n in ids], textposition="middle right",
        textfont=dict(size=10, color="#999"), marker=dict(size=8 if large else 12, color=POOL_COLOR,
                                                          line=dict(width=1, color="#bbb")),
        customdata=[[n, "pool"] for n in ids], meta="pool",
        hovertext=[_unsent_hover(graph.nodes[n][UNSENT], view) for n in ids],
        hovertemplate="%{hovertext}<extra></extra>"))


def _unsent_hover(entries: list[dict], view: PoolView, shown: int = 6) -> str:
    if "count" in entries[0]:  # suffix decoding: continuations the cap left out
        return suffix.left_out_hover(entries, shown)
    lines = [f"<b>{counted(len(entries), 'candidate')} grown but not sent</b> (outside the {len(view.entry)} most "
             f"valuable of {view.size})"]
    for entry in entries[:shown]:
        token = html.escape(repr(entry.get("text", f"id {entry['token']}")))
        lines.append(f"{token}: value {sig(entry['value'])}, rank {view.rank[int(entry['id'])]}, "
                     f"step {entry['step']}")
    if len(entries) > shown:
        lines.append(f"… and {len(entries) - shown} more")
    return "<br>".join(lines)


def tree_summary(trace: Trace, rnd: RoundRecord, graph: nx.DiGraph) -> str:
    """The figure in words (its text alternative): the accepted path, what was rejected, the target's token."""
    def tokens(status: str) -> list[str]:
        return [repr(graph.nodes[n]["text"]) for n in sorted(graph.nodes)
                if graph.nodes[n]["status"] == status and not graph.nodes[n].get(EXTRA)]

    parts = [_title(trace, rnd) + "."]
    for status, what in (("accepted", "accepted"), ("rejected", "rejected"), ("not_reached", "not reached")):
        found = tokens(status)
        if found:
            parts.append(f"{what}: {', '.join(found)}.")
    extra = next(n for n in graph.nodes if graph.nodes[n].get(EXTRA))
    own = graph.nodes[extra]
    parts.append(f"The target added {own['text']!r} ({STATUS_LABELS.get(own['status'], own['status'])}).")
    return " ".join(parts)


def _title(trace: Trace, rnd: RoundRecord) -> str:
    if rnd.search:
        return search_headline(trace, rnd)
    reason = (rnd.rule or {}).get("reason", "")
    why = {"rule": "stopped by the rule", "limit": "hit the draft limit", "budget": "token budget",
           "no-match": "no n-gram match", "eos": "drafted end-of-sequence", "none": "no drafting",
           "mid-character": "the text ends inside a character"}.get(reason, reason)
    head = f"Round {rnd.index + 1}/{len(trace.rounds)}: {rnd.n_accepted} of {counted(rnd.n_drafted, 'draft')} accepted"
    if trace.method != "speculative":
        head = f"Round {rnd.index + 1}/{len(trace.rounds)}: a plain target step (baseline)"
    return head + (f" · {why}" if why and trace.method == "speculative" else "")


def _add_edges(fig: go.Figure, graph: nx.DiGraph, pos: dict) -> None:
    groups = {"path": ([], []), "extra": ([], []), "other": ([], []), "pool": ([], [])}
    for parent, child in graph.edges:
        data = graph.nodes[child]
        key = "extra" if data.get(EXTRA) else "path" if data["status"] == "accepted" else \
            "pool" if data["status"] == "pool" else "other"
        xs, ys = groups[key]
        xs += [pos[parent][0], pos[child][0], None]
        ys += [pos[parent][1], pos[child][1], None]
    styles = {"path": dict(color=STATUS_COLORS["accepted"], width=4),
              "extra": dict(color="#555", width=2, dash="dot"),
              "other": dict(color="#b8b8b8", width=1.5),
              "pool": dict(color="#e4e4e4", width=1, dash="dot")}
    for key, (xs, ys) in groups.items():
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=styles[key], hoverinfo="skip",
                                     showlegend=False, name=f"edges:{key}"))


def label_limit(extent: float, large: bool) -> int:
    """Characters a node label may take: a whole column at phone width (beside the marker for a large tree, centred
    above it otherwise); at least 4, at most 14."""
    columns = extent + (RIGHT_LABEL_ROOM if large else 0.6) + 0.6
    room = PHONE_PLOT_PX / columns - (12 if large else 0)  # a label beside its marker starts past the marker
    return max(4, min(14, int(room / CHAR_PX[10 if large else 13])))


LABELLED_SIBLINGS = 3  # a parent's rejected / unreached children beyond this are hover-only, with a "+N more" label
KEPT_STATUSES = ("root", "accepted", "bonus", "resampled", "baseline")  # always labelled: the path the target kept


def node_labels(graph: nx.DiGraph, view: PoolView | None, limit: int) -> dict[int, str]:
    """Each node's label: its token, except that a parent's crowd of rejected or unreached children shows only its
    LABELLED_SIBLINGS most valuable, the next one reads "+N more" and the rest are hover-only (a dozen rejected
    siblings on adjacent rows stacked their labels into an unreadable column, issue 24)."""
    labels = {n: visible_token(graph.nodes[n]["text"], limit) for n in graph.nodes}
    value = (lambda n: float(view.entry[n]["value"]) if n in view.entry else 0.0) if view is not None else \
        (lambda n: 0.0)
    for parent in graph.nodes:
        crowd = [n for n in graph.successors(parent) if graph.nodes[n]["status"] not in KEPT_STATUSES + ("pool",)]
        if len(crowd) <= LABELLED_SIBLINGS + 1:
            continue
        ranked = sorted(crowd, key=lambda n: -value(n))
        hidden = ranked[LABELLED_SIBLINGS:]
        for n in hidden:
            labels[n] = ""
        labels[hidden[0]] = f"+{len(hidden)} more"
    return labels


def _add_nodes(fig: go.Figure, graph: nx.DiGraph, pos: dict, ids: list[int], status: str,
               hovers: list[str], large: bool = False, view: PoolView | None = None,
               labels: dict[int, str] | None = None) -> None:
    by_value = status == "not_reached" and view is not None
    marker = _value_marker(ids, view, large) if by_value else _marker(status, large)
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in ids], y=[pos[n][1] for n in ids], mode="markers+text",
        name=STATUS_LABELS[status] + (" (fill: value)" if by_value else ""),
        text=[labels[n] if labels is not None else visible_token(graph.nodes[n]["text"], 10 if large else 14)
              for n in ids],
        textposition="middle right" if large else "top center",
        textfont=dict(size=10 if large else 13, color="#222"),
        marker=marker,
        customdata=[[n, status] for n in ids], meta=status,
        hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>",
    ))


def _marker(status: str, large: bool = False) -> dict:
    """Colour and symbol: a hollow symbol is drawn by its outline alone (plotly strokes it in the marker colour)."""
    symbol = STATUS_SYMBOLS[status]
    outline = dict(width=2.5) if symbol.endswith("-open") else dict(width=1, color="#333")
    color = "#8a8a8a" if status == "not_reached" else STATUS_COLORS[status]
    return dict(size=12 if large else 18, color=color, symbol=symbol, line=outline)


def _value_marker(ids: list[int], view: PoolView, large: bool) -> dict:
    """Sent drafts the target never reached, filled by log10(value) with a colour bar."""
    values = [float(view.entry[n]["value"]) if n in view.entry else 1e-3 for n in ids]
    return dict(size=12 if large else 18, symbol="circle", line=dict(width=1, color="#777"),
                color=[math.log10(max(v, 1e-3)) for v in values], colorscale=VALUE_SCALE, cmin=-3, cmax=0,
                colorbar=dict(title=dict(text="value", side="right"), tickvals=[-3, -2, -1, 0],
                              ticktext=["0.001", "0.01", "0.1", "1"], thickness=10, len=0.5, x=1.0, y=0.5))
