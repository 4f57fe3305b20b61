"""The Beams tab's views (pure: a BeamTrace in, figures and HTML out; no torch, no models). They only draw what the
trace recorded (decoders/beams/trace.py); nothing here re-derives what the decoder did.

- forest_figure: one iteration's forest, one tree per input beam (x = layer, y = row), coloured by node status as
  in the draft tree (app/shared/theme.py STATUS_*); the paths of the beams carried forward are drawn thick and their
  end nodes outlined; beams that finished (drew EOS) are squares. Hover: token, p, q, score.
- width_figure: DSBD's acceptance-count distribution D[W] per layer as bars, the tail P(A >= k) against the
  thres line, the chosen width K as the one coloured bar.
- scores_figure: the ranking score of every beam carried forward, iteration by iteration, and the best finished
  one. Beam search's score is the cumulative log p; beam sampling's and DSBD's is the log of the per-step
  renormalised draw probability (score_label / SCORE_HELP say so on screen), not log p.
- candidates_html: the finished pool, ranked, with the ranking score and the target's true cumulative log p.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from decoders.beams.trace import BeamTrace

from app.shared.words import counted
from app.shared.theme import OKABE_ITO, STATUS_COLORS, STATUS_SYMBOLS, describe, empty_figure, legend_below, \
    scroll_box, sig, stop_words, title_margin, visible_token, wrap_title

FOREST_STATUS = ("root", "accepted", "rejected", "not_reached")  # decoders/beams/trace.py NODE_STATUS
FOREST_LABELS = {"root": "input beam", "accepted": "accepted", "rejected": "rejected", "not_reached": "not reached"}
SURVIVOR_COLOR = OKABE_ITO["blue"]  # the path of a beam carried to the next iteration
FINISHED_COLOR = OKABE_ITO["reddish purple"]  # a beam that drew EOS and left for the finished pool
TREE_GAP = 1.0  # rows of space between two input beams' trees
DSBD_NOTE = ("DSBD here is SpecLab's reconstruction from the authors' official code (the paper's full text was not "
             "available): the layer widths, D[W] and the thres cut follow that code's get_num_acc_prob and "
             "get_expect_cnt_by_thres.")


SCORE_HELP = {
    "beam-search": "Beam search ranks by the cumulative log-probability the target gives the beam's tokens "
                   "(finished candidates: divided by length^length_penalty, as transformers does).",
    "sampled": "Beam sampling and DSBD rank by the log of the probability of the beam's last draw in that step's "
               "joint over (beam, token), renormalised at every step (as the DSBD authors' code does). It is a "
               "ranking score, not the sequence's log p: each step divides by that step's total, so candidates that "
               "finish at different steps carry different offsets. The target's true cumulative log p is shown "
               "beside it (log p)."}
LOGP_HELP = ("log p: the target's own cumulative log-probability of the candidate's tokens (temperature 1, no "
             "top-k/top-p), recorded from the same forwards; closer to 0 = more likely.")


def score_label(method: str | None) -> str:
    """The score's name for axis titles and table headers."""
    return "score (cumulative log p)" if method == "beam-search" else "score (log of per-step draw probability)"


def score_help(method: str | None) -> str:
    return SCORE_HELP["beam-search" if method == "beam-search" else "sampled"]


def iteration_of(trace: BeamTrace | None, index: int | None) -> dict | None:
    """The iteration to show: `index` clamped into range, the last one when None."""
    if trace is None or not trace.iterations:
        return None
    last = len(trace.iterations) - 1
    return trace.iterations[last if index is None else max(0, min(int(index), last))]


def forest_layout(nodes: list[dict]) -> dict[int, tuple[float, float]]:
    """(x, y) = (layer, row) per node id: each tree's leaves on consecutive rows, a parent midway between its first
    and last child, the trees of input beams 0, 1, ... stacked top to bottom with TREE_GAP between them."""
    children: dict[int, list[int]] = {n["id"]: [] for n in nodes}
    for node in nodes:
        if node["parent"] >= 0:
            children[node["parent"]].append(node["id"])
    layer = {n["id"]: n["layer"] for n in nodes}
    roots = sorted((n for n in nodes if n["parent"] < 0), key=lambda n: (n["row"], n["id"]))
    pos: dict[int, tuple[float, float]] = {}
    next_row = 0.0
    for root in roots:
        stack = [(root["id"], False)]
        while stack:  # iterative post-order: leaves take rows in id order
            node, done = stack.pop()
            kids = sorted(children[node])
            if not done:
                stack.append((node, True))
                stack.extend((kid, False) for kid in reversed(kids))
                continue
            if kids:
                y = (pos[kids[0]][1] + pos[kids[-1]][1]) / 2
            else:
                y, next_row = next_row, next_row + 1.0
            pos[node] = (float(layer[node]), y)
        next_row += TREE_GAP
    return pos


def beam_paths(nodes: list[dict], beams: list[dict]) -> list[list[int]]:
    """Per beam ({row, tokens}) the node ids from its root through its tokens (accepted nodes first when a token
    was drawn twice); stops where the forest has no such node (an unrecorded forest)."""
    by_parent: dict[int, list[dict]] = {}
    for node in nodes:
        by_parent.setdefault(node["parent"], []).append(node)
    roots = {n["row"]: n["id"] for n in nodes if n["parent"] < 0}
    paths = []
    for beam in beams:
        if beam["row"] not in roots:
            paths.append([])
            continue
        path = [roots[beam["row"]]]
        for token in beam["tokens"]:
            matches = [n for n in by_parent.get(path[-1], []) if n["token"] == token]
            if not matches:
                break
            path.append(min(matches, key=lambda n: (n["status"] != "accepted", n["id"]))["id"])
        paths.append(path)
    return paths


def forest_figure(trace: BeamTrace | None, index: int | None = None) -> go.Figure:
    fig = go.Figure()
    it = iteration_of(trace, index)
    if it is None or not it["nodes"]:
        return empty_figure("Beam forest: none yet. Run a beam method to draw each iteration's candidates, layer "
                            "by layer." if it is None else "Beam forest: not recorded (the run had recording off).",
                            260)
    nodes = it["nodes"]
    pos = forest_layout(nodes)
    survivors = beam_paths(nodes, it["beams"])
    ended = beam_paths(nodes, it.get("ended", []))
    _edges(fig, nodes, pos, survivors, ended)
    _nodes(fig, nodes, pos, {p[-1] for p in survivors if len(p) > 1}, {p[-1] for p in ended if len(p) > 1},
           trace.method)
    title = wrap_title(f"{trace.label} · iteration {it['index'] + 1} of {len(trace.iterations)} · "
                       f"{counted(len(it['beams']), 'beam')} carried forward")
    rows = max((y for _, y in pos.values()), default=0.0) + 1
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=int(max(320, min(900, 26 * rows + 120))),
                      margin={"l": 10, "r": 10, "t": title_margin(title), "b": 10}, hovermode="closest",
                      xaxis={"title": "layer", "dtick": 1, "zeroline": False},
                      yaxis={"visible": False, "autorange": "reversed"},
                      legend=legend_below(), plot_bgcolor="white")
    counts = {s: sum(n["status"] == s for n in nodes) for s in FOREST_STATUS}
    summary = ", ".join(f"{v} {FOREST_LABELS[s]}" for s, v in counts.items() if v)
    return describe(fig, f"Beam forest of {trace.label} at iteration {it['index'] + 1}: {summary}; "
                         f"{counted(len(it['beams']), 'beam')} carried forward.")


def _edges(fig, nodes, pos, survivors, ended) -> None:
    thick = {(a, b) for path in survivors for a, b in zip(path, path[1:])}
    done = {(a, b) for path in ended for a, b in zip(path, path[1:])}
    groups = {"other": ([], [], 1, "#b0b0b0", None), "ended": ([], [], 3, FINISHED_COLOR, "finished (EOS)"),
              "kept": ([], [], 3.5, SURVIVOR_COLOR, "beam carried forward")}
    for node in nodes:
        if node["parent"] < 0:
            continue
        edge = (node["parent"], node["id"])
        xs, ys, *_ = groups["kept" if edge in thick else "ended" if edge in done else "other"]
        xs += [pos[edge[0]][0], pos[edge[1]][0], None]
        ys += [pos[edge[0]][1], pos[edge[1]][1], None]
    for xs, ys, width, color, name in groups.values():
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"width": width, "color": color},
                                     hoverinfo="skip", name=name or "edge", showlegend=name is not None))


def _nodes(fig, nodes, pos, survivor_ends, ended_ends, method: str) -> None:
    scores = {n["id"]: n.get("score") for n in nodes}
    for status in FOREST_STATUS:
        group = [n for n in nodes if n["status"] == status]
        if not group:
            continue
        ids = [n["id"] for n in group]
        fig.add_trace(go.Scatter(
            x=[pos[i][0] for i in ids], y=[pos[i][1] for i in ids], mode="markers+text", name=FOREST_LABELS[status],
            customdata=ids, text=[visible_token(n.get("text") or "", 10) for n in group],
            textposition="middle right", textfont={"size": 10}, hoverinfo="text",
            hovertext=[_hover(n, scores.get(n["id"]), n["id"] in survivor_ends, n["id"] in ended_ends, method)
                       for n in group],
            marker={"size": [14 if i in survivor_ends | ended_ends else 10 for i in ids],
                    "color": STATUS_COLORS[status],
                    "symbol": ["square" if i in ended_ends else STATUS_SYMBOLS[status] for i in ids],
                    "line": {"width": [3 if i in survivor_ends | ended_ends else 0.5 for i in ids],
                             "color": [FINISHED_COLOR if i in ended_ends else SURVIVOR_COLOR if i in survivor_ends
                                       else "#000000" for i in ids]}}))


def _hover(node: dict, score, survives: bool, finished: bool, method: str | None = None) -> str:
    if node["status"] == "root":
        return f"input beam {node['row']}" + (f" · last token {html.escape(repr(node['text']))}" if node["text"] else "")
    lines = [f"<b>{html.escape(repr(node.get('text') or ''))}</b> (token {node['token']}) · layer {node['layer']}",
             f"status: {FOREST_LABELS[node['status']]}", f"p (target) = {sig(node.get('p'))}",
             f"q (draft) = {sig(node.get('q'))}"]
    if score is not None:
        lines.append(f"{score_label(method)} = {sig(score)}")
    if node.get("logp") is not None:
        lines.append(f"log p (target, cumulative) = {sig(node['logp'])}")
    if node.get("accept_prob") is not None:
        lines.append(f"acceptance probability = {sig(node['accept_prob'])}")
    if survives:
        lines.append("carried forward as a beam")
    if finished:
        lines.append("finished: drew end of sequence")
    return "<br>".join(lines)


WIDTH_ONLY_DSBD = ("D[W] is DSBD's: it chooses how many beams each drafted layer keeps. Beam search and beam "
                   "sampling keep a fixed width, so there is nothing to draw here; pick DSBD to see it.")

def _sentence(text: str) -> go.Figure:
    """A small figure that says something in words (instead of an empty box with axes)."""
    fig = go.Figure()
    fig.add_annotation(text="<br>".join(_lines(text, 55)), showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font={"size": 13, "color": "#444444"})
    fig.update_layout(height=160, xaxis_visible=False, yaxis_visible=False, plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return describe(fig, text)


def tail(distribution: list[float]) -> list[float]:
    """P(A >= k) for k = 0..W from D[k]."""
    out, total = [], 0.0
    for value in reversed(distribution):
        total += value
        out.append(total)
    return out[::-1]


def width_figure(trace: BeamTrace | None, index: int | None = None) -> go.Figure:
    it = iteration_of(trace, index)
    layers = it["layers"] if it is not None else []
    if not layers:
        if trace is not None and trace.method != "dsbd":
            return _sentence(WIDTH_ONLY_DSBD)
        if it is not None:
            return _sentence(f"Iteration {it['index'] + 1} drafted no layer: the run had one token left to write, "
                             "which the target draws itself. Scrub to an earlier iteration to see D[W].")
        return _sentence("No DSBD layer yet: run DSBD to see how wide each drafted layer may grow.")
    # one narrow panel per layer: two short title lines and "k" under each fit a phone (~80 px a panel at 420 px)
    fig = make_subplots(rows=1, cols=len(layers), shared_yaxes=True,
                        subplot_titles=[f"layer {layer['layer']}<br>K={layer['width']}"
                                        + ("" if layer.get("passed", True) else " (stopped)") for layer in layers])
    fig.update_annotations(font_size=11)
    for col, layer in enumerate(layers, start=1):
        counts = list(range(len(layer["distribution"])))
        fig.add_trace(go.Bar(x=counts, y=layer["distribution"], name="D[k] = P(A = k)", showlegend=col == 1,
                             legendgroup="d", marker_color=[SURVIVOR_COLOR if k == layer["width"] else "#c7c7c7"
                                                            for k in counts],
                             hovertemplate="P(A = %{x}) = %{y:.3f}<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Scatter(x=counts, y=tail(layer["distribution"]), mode="lines+markers", name="P(A ≥ k)",
                                 line={"color": OKABE_ITO["orange"], "shape": "hv"}, showlegend=col == 1,
                                 legendgroup="tail", hovertemplate="P(A ≥ %{x}) = %{y:.3f}<extra></extra>"),
                      row=1, col=col)
        fig.add_trace(go.Scatter(x=[-0.5, counts[-1] + 0.5], y=[layer["thres"]] * 2, mode="lines",
                                 name=f"thres = {layer['thres']}", line={"dash": "dash", "color": "#000000"},
                                 showlegend=col == 1, legendgroup="thres", hoverinfo="skip"), row=1, col=col)
    fig.update_yaxes(range=[0, 1.05])
    fig.update_xaxes(dtick=1, title_text="k", title_standoff=4)
    title = wrap_title(f"Width per layer, iteration {it['index'] + 1}: the widest K with P(A ≥ K) ≥ thres "
                       "(k = drafts accepted of W)")
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=300 + 18 * title.count("<br>"),
                      bargap=0.15, plot_bgcolor="white", legend=legend_below(),
                      margin={"l": 40, "r": 10, "t": title_margin(title) + 30, "b": 40})
    chosen = ", ".join(f"layer {layer['layer']} K={layer['width']}" for layer in layers)
    return describe(fig, f"Acceptance-count distributions D[W] at iteration {it['index'] + 1}: {chosen}.")


def scores_figure(trace: BeamTrace | None, index: int | None = None) -> go.Figure:
    fig = go.Figure()
    if trace is None or not trace.iterations:
        return empty_figure("Beam ranking scores: none yet. Run a beam method to plot each beam's score by "
                            "iteration.", 240)
    xs, ys, logps, best_x, best_y = [], [], [], [], []
    for it in trace.iterations:
        for beam in it["beams"]:
            xs.append(it["index"] + 1)
            ys.append(beam["score"])
            logps.append("—" if beam.get("logp") is None else f"{beam['logp']:.3f}")
        if it["finished"]:
            best_x.append(it["index"] + 1)
            best_y.append(max(score for _, score in it["finished"]))
    label, help_text = score_label(trace.method), "<br>".join(_lines(score_help(trace.method), 60))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="beam carried forward",
                             marker={"color": SURVIVOR_COLOR, "size": 7}, customdata=logps,
                             hovertemplate=f"iteration %{{x}}: {label} %{{y:.3f}}<br>log p (target, cumulative) "
                                           f"%{{customdata}}<br><i>{help_text}</i><extra></extra>"))
    if best_x:
        fig.add_trace(go.Scatter(x=best_x, y=best_y, mode="lines+markers", name="best finished (÷ length)",
                                 line={"color": FINISHED_COLOR}, marker={"symbol": "square"},
                                 hovertemplate=f"iteration %{{x}}: best finished candidate's {label} ÷ its length "
                                               f"%{{y:.3f}}<extra></extra>"))
    it = iteration_of(trace, index)
    fig.add_vline(x=it["index"] + 1, line={"dash": "dot", "color": "#888888"})
    fig.update_layout(title={"text": wrap_title(f"Beam ranking {label} by iteration"), "font": {"size": 14}},
                      height=300, xaxis={"title": "iteration", "dtick": max(1, len(trace.iterations) // 10)},
                      yaxis={"title": "score" if trace.method == "beam-search" else "score (not log p)"}, margin={"l": 50, "r": 10, "t": 50, "b": 40}, plot_bgcolor="white",
                      legend=legend_below())
    return describe(fig, f"Scores of {counted(len(ys), 'beam')} over {counted(len(trace.iterations), 'iteration')}.")


TIP = 'style="text-decoration: underline dotted; cursor: help"'  # a header whose hover explains it


def candidates_html(trace: BeamTrace | None) -> str:
    """The finished pool ranked best first (the trace's own order): its ranking score ÷ length and the target's
    true cumulative log p, each with a hover that says what it is. Every candidate is a different sequence."""
    if trace is None or not trace.candidates:
        return '<div id="bm-candidates">No finished candidates yet.</div>'
    score_tip = html.escape(score_help(trace.method) + " Shown divided by the candidate's length.", quote=True)
    logp_tip = html.escape(LOGP_HELP, quote=True)
    rows = "".join(f'<tr data-rank="{rank}"><td>{rank}</td><td class="bm-text">{html.escape(c["text"])}</td>'
                   f'<td title="{score_tip}">{sig(c["score"])}</td>'
                   f'<td title="{logp_tip}">{"—" if c.get("logp") is None else sig(c["logp"])}</td>'
                   f'<td title="{TOKENS_TIP}">{len(c["tokens"])}</td></tr>'
                   for rank, c in enumerate(trace.candidates, start=1))
    table = (f'<table class="bm-table"><tr><th title="{RANK_TIP}" {TIP}>rank</th><th>candidate</th>'
             f'<th title="{score_tip}" {TIP}>{html.escape(score_label(trace.method))} ÷ length</th>'
             f'<th title="{logp_tip}" {TIP}>log p (target)</th><th title="{TOKENS_TIP}" {TIP}>tokens</th></tr>{rows}'
             '</table>')
    return f'<div id="bm-candidates">{scroll_box(table)}</div>'


RANK_TIP = "the finished candidates ordered by the ranking score ÷ length, best first (the one returned is rank 1)"
TOKENS_TIP = "the candidate's length in generated tokens"


def _lines(text: str, width: int) -> list[str]:
    """`text` broken into lines of at most about `width` characters (plotly hovers do not wrap)."""
    import textwrap

    return textwrap.wrap(html.escape(text), width)


def summary_line(trace: BeamTrace | None) -> str:
    if trace is None:
        return ""
    totals = trace.totals or {}
    speed = totals.get("tokens_per_second")
    parts = [trace.label, counted(totals.get('iterations', len(trace.iterations)), 'iteration'),
             counted(totals.get('target_forwards', 0), 'target forward'),
             counted(totals.get('draft_forwards', 0), 'draft forward'),
             f"peak KV {totals.get('peak_kv_bytes', 0) / 1024:.0f} KiB"]
    if speed:
        parts.append(f"{speed:.1f} tokens/s")
    if trace.stop_reason:
        parts.append(stop_words(trace.stop_reason))
    return " · ".join(parts)
