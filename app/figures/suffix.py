"""What suffix decoding did (decoders/drafters/suffix.py), drawn from the trace's RoundRecord.search (pure: no models).

Per round: the tail of the text that matched (its tokens, where it was found: this run's prompt and output, or the
store of earlier outputs) and the continuations that followed it there, each with how often it did; the draft tree
itself is the Generate tab's tree figure, whose nodes say the same counts on hover. Over the run: the paper's one
idea, that the draft's size follows the match length: per round, the matched length, the drafts it earned (the cap)
and what the target accepted.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from decoders.trace import RoundRecord, Trace

from app.shared.theme import OKABE_ITO, STATUS_COLORS, describe, empty_figure, sig, title_margin, visible_token, \
    wrap_title

SHOWN_TAIL = 12  # matched tokens drawn (a long match shows its last ones)
SHOWN_NEXT = 8  # first-level continuations drawn


def is_suffix(search: dict | None) -> bool:
    return bool(search) and search.get("method") == "suffix"


def is_suffix_trace(trace: Trace) -> bool:
    return any(is_suffix(r.search) for r in trace.rounds)


def _tail(n: int) -> str:
    """"the last token" / "the last 6 tokens": the matched tail, in words."""
    return "the last token" if n == 1 else f"the last {n} tokens"


def headline(trace: Trace, rnd: RoundRecord) -> str:
    """'Round 4/12: the last 6 tokens occurred in this run's text; 6 drafts (cap 6), 5 accepted'."""
    search = rnd.search or {}
    head = f"Round {rnd.index + 1}/{len(trace.rounds)}: "
    if not search.get("match_len"):
        return head + "no tail of the text occurred before: nothing to copy, a plain target step"
    found = f"{_tail(search['match_len'])} occurred in {search.get('source', 'the text')}; "
    if search.get("stop") == "cost" and not rnd.n_drafted:
        return head + found + "no draft sent: the cost controller found none worth its verification (a plain step)"
    if search.get("stop") == "cost":
        priced = sum(entry.get("chance") is not None for entry in search.get("pool") or [])
        return head + found + (f"the cost controller sent {rnd.n_drafted} of {priced} candidates, "
                               f"{rnd.n_accepted} accepted")
    return head + found + f"{rnd.n_drafted} drafts (cap {search.get('cap')}), {rnd.n_accepted} accepted"


def node_lines(entry: dict) -> list[str]:
    """The hover lines of one drafted or left-out node: its count and its estimate."""
    lines = [f"followed its parent string {entry['count']} of the {entry['of']} times that string occurred",
             f"estimated probability (count ÷ occurrences, multiplied down the path) = {sig(entry['value'])}"]
    if entry.get("chance") is not None:  # controller "cost" priced the draft
        lines.append(f"calibrated chance the target accepts it (the counts × how often the target took such steps "
                     f"at this match length) = {sig(entry['chance'])}")
    return lines


def left_out_hover(entries: list[dict], shown: int = 6) -> str:
    """The tree's grey "+n" node: continuations that passed the minimum probability but not the cap."""
    priced = any(entry.get("chance") is not None for entry in entries)
    why = "by the cap or by their price (the cost controller)" if priced else "by the cap"
    lines = [f"<b>{len(entries)} continuations above the minimum probability, left out {why}</b>"]
    for entry in entries[:shown]:
        token = html.escape(repr(entry.get("text", f"id {entry['token']}")))
        lines.append(f"{token}: followed {entry['count']} of {entry['of']} times, estimate {sig(entry['value'])}")
    if len(entries) > shown:
        lines.append(f"… and {len(entries) - shown} more")
    return "<br>".join(lines)


def match_figure(trace: Trace, index: int | None = None, height: int = 340) -> go.Figure:
    """One round: the matched tail (its last tokens above the plot, all of them on hover) and the continuations
    that followed it there (bars: how often each did), the drafted ones in the accepted colour, those the cap left
    out in grey."""
    if not trace.rounds:
        return empty_figure("No rounds yet.", height)
    index = len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))
    rnd = trace.rounds[index]
    search = rnd.search or {}
    if not is_suffix(search):
        return empty_figure(f"Round {index + 1} drafted nothing: no room was left in the token budget (or the "
                            "run was recorded without its search).", height)
    if not search.get("match_len"):
        return empty_figure(f"Round {index + 1}: no tail of the text occurred earlier, so suffix decoding had "
                            "nothing to copy; the target took one plain step.", height)
    fig = go.Figure()
    _add_next(fig, search)
    _add_tail(fig, search)
    title = wrap_title(f"Round {index + 1}: {_tail(search['match_len'])} occurred in "
                       f"{search.get('source', 'the text')}, and this followed them")
    top = title_margin(title) + 34  # room for the tail's line under the title
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=height, plot_bgcolor="white",
                      margin=dict(l=10, r=30, t=top, b=10), showlegend=False,
                      xaxis=dict(title="times it followed the matched tail", rangemode="tozero", gridcolor="#eee"),
                      yaxis=dict(showgrid=False, autorange="reversed", automargin=True))
    return describe(fig, match_summary(index, search))


def _add_tail(fig: go.Figure, search: dict) -> None:
    """The matched tail, one line above the plot (its last SHOWN_TAIL tokens; hover: all of it and its cap)."""
    texts = search.get("match_texts") or [str(t) for t in search.get("match", [])]
    shown = texts[-SHOWN_TAIL:]
    label = "tail: " + ("… " if len(texts) > len(shown) else "") + " ".join(visible_token(t, 8) for t in shown)
    factor = float(search.get("factor", 1.0))
    fig.add_annotation(text=html.escape(label), xref="paper", yref="paper", x=0, y=1.02, xanchor="left",
                       yanchor="bottom", showarrow=False, font=dict(size=12, color="#333"),
                       hovertext=f"the last {search['match_len']} tokens: " + html.escape(repr("".join(texts)))
                                 + f"<br>found in {search.get('source')}; a match this long earns at most "
                                   f"floor({sig(factor)} × {search['match_len']}) = "
                                   f"{int(factor * search['match_len'] + 1e-6)} drafts (the round's cap: "
                                   f"{search.get('cap')}, also bounded by the most drafts per round)")


def _add_next(fig: go.Figure, search: dict) -> None:
    """The first tokens after the tail: drafted ones coloured, the ones the cap left out grey."""
    chosen = set(search.get("chosen") or [])
    first = [e for e in search.get("pool") or [] if int(e["parent"]) == -1][:SHOWN_NEXT]
    if not first:
        return
    names = [f"{i + 1}: {visible_token(e.get('text', str(e['token'])), 12)}" for i, e in enumerate(first)]
    colors = [STATUS_COLORS["accepted"] if int(e["id"]) in chosen else "#d0d0d0" for e in first]
    fig.add_trace(go.Bar(y=names, x=[int(e["count"]) for e in first], orientation="h", marker_color=colors,
                         text=[f"{e['count']}/{e['of']}" for e in first], textposition="outside", cliponaxis=False,
                         hovertext=["<br>".join([f"<b>{html.escape(repr(e.get('text', '')))}</b> "
                                                 f"({'drafted' if int(e['id']) in chosen else _why_left(e)})",
                                                 *node_lines(e)]) for e in first],
                         hovertemplate="%{hovertext}<extra></extra>"))


def _why_left(entry: dict) -> str:
    return "held back by the cost controller's price" if entry.get("chance") is not None else "left out by the cap"


def match_summary(index: int, search: dict) -> str:
    nexts = [e for e in search.get("pool") or [] if int(e["parent"]) == -1]
    parts = ", ".join(f"{e.get('text', e['token'])!r} {e['count']}/{e['of']}" for e in nexts[:SHOWN_NEXT])
    return (f"Round {index + 1}: {_tail(search['match_len'])} occurred in {search.get('source')}; "
            f"cap {search.get('cap')} drafts; what followed: {parts or 'nothing above the minimum probability'}.")


def run_figure(trace: Trace, index: int | None = None, height: int = 420) -> go.Figure:
    """Per round: the matched length (line), the drafts it earned (cap, hollow bars) and the drafts accepted."""
    rounds = [r for r in trace.rounds if is_suffix(r.search)]
    if not rounds:
        return empty_figure("Recorded without the suffix search (record=False): nothing to draw.", height)
    x = [r.index + 1 for r in rounds]
    shown = int(index) + 1 if index is not None else None
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=[r.search.get("cap", 0) for r in rounds], name="drafts the match earned (cap)",
                         marker=dict(color="rgba(0,0,0,0)", line=dict(color="#888", width=1)),
                         hovertemplate="round %{x}: cap %{y} drafts<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=[r.n_accepted for r in rounds], name="drafts accepted",
                         marker=dict(color=STATUS_COLORS["accepted"],
                                     line=dict(color="#000", width=[3 if i == shown else 0 for i in x])),
                         hovertemplate="round %{x}: %{y} drafts accepted<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=[r.search.get("match_len", 0) for r in rounds], mode="lines+markers",
                             name="matched tail length", line=dict(color=OKABE_ITO["vermillion"]),
                             customdata=[[r.search.get("source", "")] for r in rounds],
                             hovertemplate="round %{x}: the last %{y} tokens matched (%{customdata[0]})"
                                           "<extra></extra>"))
    title = wrap_title("The draft follows the match: longer matched tails earn longer drafts")
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=height, plot_bgcolor="white",
                      barmode="overlay", margin=dict(l=10, r=10, t=title_margin(title), b=10),
                      legend=dict(orientation="h", y=-0.32, x=0, yanchor="top", font=dict(size=11)),
                      xaxis=dict(title="round (outlined: this round)", gridcolor="#eee"),
                      yaxis=dict(title="tokens", rangemode="tozero", gridcolor="#eee"))
    return describe(fig, run_summary(rounds))


def run_summary(rounds: list[RoundRecord]) -> str:
    earlier = sum(r.search.get("source") == "earlier outputs" for r in rounds)
    matched = [r for r in rounds if r.search.get("match_len")]
    return (f"{len(rounds)} rounds: {len(matched)} found a matching tail ({earlier} of them in earlier outputs); "
            f"matched lengths {', '.join(str(r.search.get('match_len')) for r in rounds[:20])}"
            f"{' …' if len(rounds) > 20 else ''}; accepted {sum(r.n_accepted for r in rounds)} drafts in all.")
