"""A cross-tokenizer round's two tokenizations (pure: trace in, figure out).

The draft's own tokens run along the top lane, the target's tokens they became along the bottom one, each box
drawn over the bytes of drafted text it spells: where a target token joins two draft pieces, or a draft piece is
cut in two, the boxes do not line up. Hover a target token for the draft pieces it came from and what the target
did with it. Reads RoundRecord.retokenized (decoders/trace.py; written by decoders/drafters/cross_tokenizer.py).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from decoders.trace import RoundRecord, Trace

from app.shared.theme import STATUS_COLORS, STATUS_LABELS, describe, empty_figure, hover_lines, marks_in, \
    title_margin, visible_token, wrap_title

DRAFT_COLOR = "#9ecae1"  # the draft's own tokens (a light blue: they are not a verdict)
UNSENT_COLOR = "#e6e6e6"
LANES = {"draft": 1.0, "target": 0.0}
MODES = {"retokenized": "the draft's text encoded by the target's tokenizer (temperature 0)",
         "shared": "each draft sampled among the tokens both vocabularies spell alike, one target token each "
                   "(temperature > 0: q then lives on the target's vocabulary, so the test stays exact)"}


def has_retokenized(trace: Trace | None) -> bool:
    return trace is not None and any(r.retokenized for r in trace.rounds)


def retokenize_figure(trace: Trace | None, index: int | None = None) -> go.Figure | None:
    """None for traces of other drafters; otherwise round `index`'s two tokenizations (default: the last round)."""
    if not has_retokenized(trace):
        return None
    index = len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))
    rnd = trace.rounds[index]
    info = rnd.retokenized
    if not info or not info["pieces"]:
        return empty_figure(f"Round {index + 1}: nothing drafted ({_why_empty(rnd)}), so nothing to re-tokenize.",
                            220)
    fig = go.Figure()
    _draft_lane(fig, info)
    _target_lane(fig, rnd, info)
    end = max(piece["end"] for piece in info["pieces"])
    start = min(0, info["pieces"][0]["start"])  # below 0: a healed first piece spells committed bytes again
    title = wrap_title(_headline(rnd, info))
    fig.update_layout(
        title=dict(text=title, font=dict(size=13)), height=290, barmode="overlay", bargap=0.35,
        margin=dict(l=10, r=10, t=title_margin(title), b=80), plot_bgcolor="white", hovermode="closest",
        legend=dict(orientation="h", y=-0.45, x=0, yanchor="top", font=dict(size=10)),
        xaxis=dict(range=[start - 0.5, end + 0.5], title=dict(text="bytes of the drafted text", font=dict(size=10)),
                   showgrid=False, zeroline=False, tickfont=dict(size=9, color="#888")),
        yaxis=dict(tickvals=list(LANES.values()), ticktext=[f"draft: {info['draft']}", f"target: {info['target']}"],
                   range=[-0.6, 1.6], showgrid=False, zeroline=False, tickfont=dict(size=11)))
    return describe(fig, _summary(rnd, info))


def _bars(fig: go.Figure, lane: str, boxes: list[dict], name: str, color: str, font: str = "#111") -> None:
    """Boxes [{start, end, label, hover}] as horizontal bars on one lane: base = start, length = bytes."""
    if not boxes:
        return
    fig.add_trace(go.Bar(
        y=[LANES[lane]] * len(boxes), x=[max(b["end"] - b["start"], 0.35) for b in boxes],
        base=[b["start"] for b in boxes], orientation="h", name=name, marker=dict(color=color,
                                                                                   line=dict(color="#333", width=1)),
        text=[b["label"] for b in boxes], textposition="inside", insidetextanchor="middle",
        textfont=dict(size=11, color=font), hovertext=[b["hover"] for b in boxes],
        hovertemplate="%{hovertext}<extra></extra>", width=0.6))


def _draft_lane(fig: go.Figure, info: dict) -> None:
    sent_end = max((node["end"] for node in info["nodes"]), default=0)
    sent, unsent = [], []
    for i, piece in enumerate(info["pieces"]):
        became = [node for node in info["nodes"] if i in node["pieces"]]
        text = html.escape(repr(piece["text"]))
        lines = [f"<b>{text}</b>: the draft's token", f"id {piece['id']} in {html.escape(info['draft'])}'s vocabulary, "
                 f"bytes {max(piece['start'], 0)}–{piece['end']} of the drafted text"]
        if piece["start"] < 0:
            healed = html.escape(repr((info.get("context") or {}).get("healed", "")))
            count = -piece["start"]
            lines.append(f"before them, its first {count} byte{'s' * (count != 1)} ({healed}): the committed text's "
                         "end, spelled again (token healing: the draft chose a longer token than the text's last one)")
        if became:
            lines.append("became part of the target's " + " + ".join(
                f"node {node['node']}" for node in became))
        else:
            lines.append("not sent to the target: past the round's draft limit, or a character it left unfinished")
        meaning = marks_in(visible_token(piece["text"], 10 ** 6))
        if meaning:
            lines.append(f"label: {meaning}")
        box = {"start": piece["start"], "end": piece["end"], "label": visible_token(piece["text"], 12),
               "hover": hover_lines(lines)}
        (sent if became or piece["start"] < sent_end else unsent).append(box)
    _bars(fig, "draft", sent, "the draft's tokens", DRAFT_COLOR)
    _bars(fig, "draft", unsent, "drafted, not sent", UNSENT_COLOR, "#777")


def _target_lane(fig: go.Figure, rnd: RoundRecord, info: dict) -> None:
    by_status: dict[str, list[dict]] = {}
    nodes = {node.id: node for node in rnd.nodes}
    for entry in info["nodes"]:
        node = nodes.get(entry["node"])
        status = node.status if node is not None else "not_reached"
        text = node.text if node is not None else ""
        lines = [f"<b>{html.escape(repr(text))}</b>: the target's token",
                 f"node {entry['node']}, {STATUS_LABELS.get(status, status)}, bytes {entry['start']}–{entry['end']} of "
                 "the drafted text", pieces_sentence(info, entry)]
        by_status.setdefault(status, []).append({"start": entry["start"], "end": entry["end"],
                                                 "label": visible_token(text, 12), "hover": hover_lines(lines)})
    for status in ("accepted", "rejected", "not_reached"):
        font = "#fff" if status == "rejected" else "#111"
        _bars(fig, "target", by_status.get(status, []), f"target token: {STATUS_LABELS[status]}",
              STATUS_COLORS[status], font)


def pieces_sentence(info: dict, entry: dict) -> str:
    """Which draft pieces one target token came from, in words."""
    pieces = [info["pieces"][i] for i in entry["pieces"] if i < len(info["pieces"])]
    shown = " + ".join(html.escape(repr(piece["text"])) for piece in pieces) or "none"
    if info.get("mode") == "shared":
        return f"the draft's token {shown}, spelled alike in both vocabularies"
    kind = "one draft token" if len(pieces) == 1 else f"{len(pieces)} draft tokens"
    return f"from {kind}: {shown} (re-tokenized: no q of its own; at temperature 0 the target's argmax decides)"


def pieces_lines(rnd: RoundRecord, node: int) -> list[str]:
    """For the tree's hover: the draft pieces behind one drafted node of a cross-tokenizer round ([] otherwise)."""
    info = rnd.retokenized
    entry = next((e for e in info["nodes"] if e["node"] == node), None) if info else None
    return [pieces_sentence(info, entry)] if entry is not None else []


def _headline(rnd: RoundRecord, info: dict) -> str:
    pieces, nodes = len(info["pieces"]), len(info["nodes"])
    accepted = sum(1 for node in rnd.nodes if node.status == "accepted")
    verb = "were" if pieces != 1 else "was"
    how = f"{verb} re-tokenized into" if info.get("mode") == "retokenized" else f"{verb} sent as"
    return (f"Round {rnd.index + 1}: the draft's {pieces} token{'s' * (pieces != 1)} {how} {nodes} target "
            f"token{'s' * (nodes != 1)} · {accepted} accepted")


def _summary(rnd: RoundRecord, info: dict) -> str:
    """The figure in words, with what the draft's cache did to catch up."""
    context = info.get("context") or {}
    drafted = "".join(piece["text"] for piece in info["pieces"])
    healed = context.get("healed", "")
    drafted = drafted[len(healed):] if healed and drafted.startswith(healed) else drafted
    return (f"{_headline(rnd, info)}. Mode: {MODES.get(info.get('mode'), info.get('mode'))}. Drafted text: "
            f"{drafted!r}; not sent: {info.get('unsent', '')!r}. Before drafting, the draft's cache kept "
            f"{context.get('kept', 0)} of its tokens of the committed text and fed {context.get('fed', 0)} "
            "(what the target committed, and the last drafts encoded again)" +
            (f"; its first draft spelled the text's last {healed!r} again (token healing)." if healed else "."))


def _why_empty(rnd: RoundRecord) -> str:
    reason = (rnd.rule or {}).get("reason", "")
    return {"mid-character": "the committed text ends inside a character", "budget": "no tokens left to draft",
            "rule": "the rule stopped at once"}.get(reason, reason or "no draft")
