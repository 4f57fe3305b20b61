"""The Whisper tab's views (pure: traces in, figures and HTML out; no torch, no models).

- beam_figure: one decoder's beam tree up to a step (plotly + networkx, the same tidy layout as the draft tree):
  earlier steps show the beams that lived, finished or were refused; the chosen step shows its whole pool. Trees
  of one click share the x axis (decoding step), so stacked they compare column by column. The chosen
  transcript's path is black and labelled, everything else faded; from the first token where this decoder's
  transcript departs from the first decoder's, the path turns thick purple behind a dashed line naming both
  tokens. Hover: token, log p, cumulative score, lookahead key, EOT gap.
- results_html: per decoder the transcript as a word-level diff against the reference, WER, time, RTF.
"""
from __future__ import annotations

import html

import networkx as nx
import plotly.graph_objects as go

from decoders.whisper.trace import WhisperTrace
from decoders.whisper.wer import align, wer

from app.figures.tree import tidy_layout
from app.shared.words import counted
from app.shared.theme import OKABE_ITO, describe, legend_below, scroll_box, sig, title_margin, visible_token, \
    wrap_title

BEAM_COLORS = {"root": "#4c4c4c", "kept": OKABE_ITO["blue"], "finished": OKABE_ITO["bluish green"],
               "dropped": "#c7c7c7", "filtered": OKABE_ITO["vermillion"], "overflow": OKABE_ITO["orange"]}
BEAM_SYMBOLS = {"root": "circle", "kept": "circle", "finished": "square", "dropped": "circle-open",
                "filtered": "x", "overflow": "square-open"}
BEAM_LABELS = {"root": "start of transcript", "kept": "kept (live beam)", "finished": "finished (EOT)",
               "dropped": "dropped", "filtered": "EOT refused (Filter-Ends)", "overflow": "finished, pool full"}
DIFF_STYLE = {"ok": "", "sub": f"background:{OKABE_ITO['orange']}33;text-decoration:underline wavy",
              "ins": f"background:{OKABE_ITO['sky blue']}44;text-decoration:underline",
              "del": f"background:{OKABE_ITO['vermillion']}33;text-decoration:line-through"}
PERSISTENT = ("kept", "finished", "filtered", "overflow")  # what earlier steps keep on screen
PATH_NAME, DIVERGED_NAME = "chosen transcript", "where it leaves the first decoder's transcript"  # legend entries


def chosen_path(trace: WhisperTrace) -> list[int]:
    """Node ids from the root's child to the node of the chosen transcript."""
    if not trace.final:
        return []
    node, path = trace.final[0].node, []
    while node > 0:
        path.append(node)
        node = trace.nodes[node].parent
    return path[::-1]


def divergence(trace: WhisperTrace, reference: WhisperTrace | None) -> int | None:
    """Index of the first output token where trace's transcript differs from reference's (None: identical)."""
    if reference is None or trace.output_ids == reference.output_ids:
        return None
    pairs = zip(trace.output_ids, reference.output_ids)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(trace.output_ids), len(reference.output_ids)))


def shown_nodes(trace: WhisperTrace, step: int) -> list[int]:
    """Root, the persistent nodes of steps before `step`, and the whole pool of `step`."""
    keep = [0]
    for node in trace.nodes[1:]:
        if node.step < step and node.status in PERSISTENT or node.step == step:
            keep.append(node.id)
    return keep


def beam_figure(trace: WhisperTrace | None, step: int | None = None,
                reference: WhisperTrace | None = None, steps_shown: int | None = None) -> go.Figure:
    """One decoder's tree up to `step`. Trees drawn for one click share `steps_shown` (the longest search), so a
    step sits at the same x in every tree and the trees, stacked, compare column by column."""
    fig = go.Figure()
    if trace is None or not trace.steps:
        fig.update_layout(title="no beam search yet", height=260, xaxis_visible=False, yaxis_visible=False)
        return fig
    step = len(trace.steps) - 1 if step is None else max(0, min(step, len(trace.steps) - 1))
    graph = nx.DiGraph()
    for node_id in shown_nodes(trace, step):
        graph.add_node(node_id)
        if node_id:
            graph.add_edge(trace.nodes[node_id].parent, node_id)
    pos = tidy_layout(graph)
    chosen = chosen_path(trace)
    path = set(chosen)
    split = divergence(trace, reference)
    diverged = set(chosen[split:]) if split is not None else set()
    _edges(fig, graph, pos, path, diverged)
    _nodes(fig, trace, graph, pos, path, step)
    note = _mark_divergence(fig, trace, reference, split, chosen, pos)
    title = wrap_title(f"{trace.label}: “{trace.output_text.strip()[:70]}” · step {step + 1} of {len(trace.steps)} · "
                       + counted(len(trace.steps[step].candidates), "candidate"))
    if note:  # its own line, in the divergence's colour (a plotly annotation collided with the title on phones)
        title += f"<br><span style='color:{OKABE_ITO['reddish purple']}'>{note}</span>"
    rows = len({round(y, 3) for _, y in pos.values()})
    width = max(steps_shown or 0, len(trace.steps))
    plot_height = min(440, max(110, 40 + 11 * rows))  # px for the tree itself; title and legend come on top
    top = title_margin(title)
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=plot_height + top + 70,
                      margin={"l": 10, "r": 10, "t": top, "b": 70}, hovermode="closest",
                      xaxis={"range": [-0.4, width + 1.6], "dtick": 5, "tickprefix": "step ", "showgrid": True,
                             "gridcolor": "#eeeeee", "zeroline": False},
                      yaxis={"visible": False, "autorange": "reversed"},
                      legend=legend_below(font={"size": 10}),
                      plot_bgcolor="white")
    counts = {s: sum(trace.nodes[n].status == s for n in trace.steps[step].candidates) for s in BEAM_LABELS}
    summary = ", ".join(f"{v} {BEAM_LABELS[s]}" for s, v in counts.items() if v)
    where = "" if split is None else f" It departs from {reference.label} at token {split + 1}."
    return describe(fig, f"Beam tree of {trace.label} at step {step + 1}: {summary}.{where}")


def _mark_divergence(fig, trace, reference, split, chosen, pos) -> str:
    """A dashed line before the token where this decoder's transcript leaves the first decoder's; returns the
    title's note naming both tokens ("" when the transcripts agree)."""
    if split is None or split >= len(chosen) or chosen[split] not in pos:
        return ""
    x = pos[chosen[split]][0]
    theirs = reference.output_ids[split] if split < len(reference.output_ids) else None
    their_text = "the end" if theirs is None else repr(_token_text(reference, theirs))
    fig.add_vline(x=x - 0.5, line={"dash": "dash", "color": OKABE_ITO["reddish purple"], "width": 1.5})
    return (f"leaves {html.escape(reference.decoder)} at step {x:.0f}: "
            f"{html.escape(repr(trace.nodes[chosen[split]].text))} for {html.escape(their_text)}")


def _token_text(trace: WhisperTrace, token: int) -> str:
    return next((n.text for n in trace.nodes if n.token == token), str(token))


def _edges(fig, graph, pos, path, diverged) -> None:
    styles = (("other", 1, "#cfcfcf"), ("path", 3, "#000000"), ("diverged", 5, OKABE_ITO["reddish purple"]))
    for group, width, color in styles:
        xs, ys = [], []
        for parent, child in graph.edges:
            kind = "diverged" if child in diverged else "path" if child in path else "other"
            if kind == group:
                xs += [pos[parent][0], pos[child][0], None]
                ys += [pos[parent][1], pos[child][1], None]
        if xs:
            name = {"path": PATH_NAME, "diverged": DIVERGED_NAME}.get(group)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"width": width, "color": color},
                                     hoverinfo="skip", name=name or "edge", showlegend=name is not None))


def _nodes(fig, trace, graph, pos, path, step) -> None:
    """Markers for every shown node; a label only on the chosen path and on the live or finished beams of the
    shown step, so a dozen dropped siblings do not pile their labels (they keep their hover)."""
    for status, label in BEAM_LABELS.items():
        ids = [n for n in graph.nodes if trace.nodes[n].status == status]
        if not ids:
            continue
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in ids], y=[pos[n][1] for n in ids], mode="markers+text", name=label,
            text=[_label(trace, n, path, step) for n in ids], textposition="middle right",
            textfont={"size": 10, "color": ["#000000" if n in path else "#666666" for n in ids]},
            hovertext=[_hover(trace, n) for n in ids], hoverinfo="text",
            marker={"size": [13 if trace.nodes[n].step == step else 9 for n in ids], "color": BEAM_COLORS[status],
                    "symbol": BEAM_SYMBOLS[status], "opacity": [1.0 if n in path else 0.55 for n in ids],
                    "line": {"width": [2.5 if n in path else 0.5 for n in ids], "color": "#000000"}}))


def _label(trace: WhisperTrace, node_id: int, path: set, step: int) -> str:
    node = trace.nodes[node_id]
    on_step = node.step == step and node.status in ("kept", "finished", "filtered")
    if node_id == 0 or not (node_id in path or on_step):
        return ""
    return visible_token(node.text, 10)


def _hover(trace: WhisperTrace, node_id: int) -> str:
    node = trace.nodes[node_id]
    if node_id == 0:
        return "start of transcript"
    lines = [f"<b>{html.escape(repr(node.text))}</b> (token {node.token}) · step {node.step + 1}",
             f"status: {BEAM_LABELS[node.status]}", f"log p(token | beam) = {sig(node.logprob)}",
             f"cumulative log p (search score) = {sig(node.score)}"]
    if node.key is not None:
        lines.append(f"lookahead key (ranking) = {sig(node.key)}")
    if node.eot_gap is not None:
        lines.append(f"log p(EOT) − best other token = {sig(node.eot_gap)}")
    prefix = "".join(trace.nodes[n].text for n in _ancestors(trace, node_id))
    lines.append("text so far: " + html.escape(prefix[-60:]))
    return "<br>".join(lines)


def _ancestors(trace: WhisperTrace, node_id: int) -> list[int]:
    chain = []
    while node_id > 0:
        chain.append(node_id)
        node_id = trace.nodes[node_id].parent
    return chain[::-1]


def diff_html(reference: str, hypothesis: str, language: str = "en") -> str:
    """The hypothesis word by word against the reference (both as Whisper's normaliser writes them, the words WER
    counts): substitutions (wavy), insertions, deletions (struck)."""
    parts = []
    for op in align(reference, hypothesis, language):
        if op.op == "ok":
            parts.append(html.escape(op.hyp))
        elif op.op == "sub":
            parts.append(f'<span class="wd-sub" style="{DIFF_STYLE["sub"]}" title="reference: '
                         f'{html.escape(op.ref)}">{html.escape(op.hyp)}</span>')
        elif op.op == "ins":
            parts.append(f'<span class="wd-ins" style="{DIFF_STYLE["ins"]}" title="not in the reference">'
                         f'{html.escape(op.hyp)}</span>')
        else:
            parts.append(f'<span class="wd-del" style="{DIFF_STYLE["del"]}" title="missing">{html.escape(op.ref)}</span>')
    return " ".join(parts)


RESULT_HEADERS = (
    ("decoder", "the decoding method (Whisper's own, or SpecLab's reconstruction of a paper's)"),
    ("transcript", "what the decoder wrote; with a reference, its words are marked against it"),
    ("WER", "word error rate: (substituted + inserted + missing words) ÷ reference words, after Whisper's text "
            "normaliser; can exceed 100 %"),
    ("time", "seconds this decoder took on this machine: the whole decode (the audio encoder and the search, "
             "lookahead rollouts included)"),
    ("RTF", "real-time factor: decoding seconds ÷ the clip's seconds (below 1: faster than real time)"),
    ("steps", "decoding steps: one per token position the decoder chose"),
)
TIPS = {name: html.escape(tip, quote=True) for name, tip in RESULT_HEADERS}
WHISPER_CSS = """
.sw-table { border-collapse: collapse; }
.sw-table th, .sw-table td { padding: 4px 8px; vertical-align: top; text-align: left; }
.sw-table th { cursor: help; }
.sw-table .sw-text { min-width: 12em; }
.sw-table td:not(.sw-text):not(:first-child) { white-space: nowrap; }
@media (max-width: 860px) { .sw-table { font-size: 12px; } .sw-table th, .sw-table td { padding: 3px 3px; }
                            .sw-table .sw-text { min-width: 7em; }
                            .sw-table td:first-child { max-width: 6.5em; overflow-wrap: anywhere; } }
"""


def results_html(traces: list[WhisperTrace], reference: str = "") -> str:
    """The decoders side by side: transcript (diffed when a reference is given), WER, time, real-time factor."""
    if not traces:
        return '<div id="sw-results">No transcription yet.</div>'
    has_ref = bool(reference.strip())
    head = "<tr>" + "".join(f'<th title="{html.escape(tip, quote=True)}">{name}</th>' for name, tip in RESULT_HEADERS
                            if name != "WER" or has_ref) + "</tr>"
    first = traces[0]
    rows = []
    for trace in traces:
        text = diff_html(reference, trace.output_text, trace.language) if has_ref else html.escape(trace.output_text)
        split = divergence(trace, first)
        note = "" if split is None else f'<br><small class="sw-diverge">diverges from {html.escape(first.decoder)} ' \
                                        f"at token {split + 1}</small>"
        rtf = trace.seconds / trace.audio["seconds"] if trace.audio.get("seconds") else float("nan")
        wer_cell = (f'<td title="word error rate: (substituted + inserted + missing words) / reference words, after '
                    f"Whisper's text normaliser; can exceed 100 %\">{wer(reference, trace.output_text, trace.language):.1%}"
                    "</td>") if has_ref else ""
        rows.append(f'<tr data-decoder="{html.escape(trace.decoder)}"><td>{html.escape(trace.label)}</td>'
                    f'<td class="sw-text">{text}{note}</td>{wer_cell}'
                    f'<td title="{TIPS["time"]}">{trace.seconds:.2f} s</td>'
                    f'<td title="{TIPS["RTF"]}">{rtf:.2f}</td><td title="{TIPS["steps"]}">{len(trace.steps)}</td></tr>')
    legend = ('<p class="sw-legend"><span style="%s">substituted</span> · <span style="%s">inserted</span> · '
              '<span style="%s">missing</span> (against the reference, both after Whisper&#39;s own text '
              "normaliser: lower case, no punctuation, spellings and numbers unified)"
              "</p>" % (DIFF_STYLE["sub"], DIFF_STYLE["ins"], DIFF_STYLE["del"])) if has_ref else ""
    table = f'<table class="sw-table">{head}{"".join(rows)}</table>'
    return f'<div id="sw-results">{scroll_box(table)}{legend}</div>'
