"""The Batch tab's views (pure): ragged lanes, the batch's numbers, and tokens/s against B.

Lanes: one per row, one column per batched round. A column is as wide as that round's batched target forward (the
longest row's root + drafts); in it each row shows the tokens it kept (accepted drafts, then the target's own
token), the drafts it verified and threw away, and the slots it sat out as padding, drawn as padding. A row that
finished has left the batch: its lane stops. Every block and number has a hover.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from decoders.batch import BatchTrace

from app.shared.words import counted
from app.shared.theme import OKABE_ITO, STATUS_COLORS, describe, empty_figure, legend_below, scroll_box, title_margin, \
    wrap_title

BATCH_CSS = """
.bt-lanes { font-size: 12px; padding-bottom: 4px; }
.bt-lane { display: flex; align-items: center; gap: 6px; margin: 3px 0; padding: 2px 4px; border-radius: 6px;
           cursor: pointer; border: 2px solid transparent; background: none; width: max-content; min-width: 100%;
           font: inherit; color: inherit; text-align: left; }
.bt-lane:hover, .bt-lane:focus-visible { border-color: #0072B2; }
.bt-lane.bt-selected { border-color: #0072B2; background: rgba(0, 114, 178, 0.07); }
.bt-name { width: 3.2em; flex: none; font-weight: 600; }
.bt-track { display: flex; gap: 3px; flex-wrap: nowrap; }
.bt-round { display: flex; gap: 1px; padding: 1px; border-radius: 3px; background: #f2f2f2; }
.bt-slot { width: 9px; height: 16px; border-radius: 2px; display: inline-block; }
.bt-kept { background: """ + STATUS_COLORS["accepted"] + """; }
.bt-own { background: """ + STATUS_COLORS["bonus"] + """; outline: 1px solid #9a8f00; outline-offset: -1px; }
.bt-rejected { background: #fff; outline: 1px solid #222; outline-offset: -1px;
               background-image: linear-gradient(45deg, transparent 45%, #222 45%, #222 55%, transparent 55%); }
.bt-pad { background: repeating-linear-gradient(135deg, #d9d9d9 0 2px, #f7f7f7 2px 4px); }
.bt-gone { width: 9px; height: 16px; display: inline-block; }
.bt-count { flex: none; min-width: 7.5em; color: #333; white-space: nowrap; }
.bt-key { display: inline-flex; align-items: center; gap: 4px; margin-right: 12px; cursor: help; }
"""

# Lane clicks: one delegated listener on the component (lanes are re-rendered every round) sends the row number.
LANES_JS = ("element.addEventListener('click', (e) => { const lane = e.target.closest('[data-row]'); "
            "if (lane) { trigger('click', {row: Number(lane.dataset.row)}); } });")


def _slot(kind: str, tip: str) -> str:
    return f'<span class="bt-slot bt-{kind}" title="{html.escape(tip, quote=True)}"></span>'


def lane_cells(batch: BatchTrace) -> list[list[dict | None]]:
    """Per row, per round: {kept, own, rejected, pad, width} or None where the row had already left the batch."""
    cells: list[list[dict | None]] = [[] for _ in batch]
    for rnd in batch.rounds:
        width = max(d + 1 for d in rnd.drafted)  # the round's batched forward: the longest root + drafts
        where = {row: i for i, row in enumerate(rnd.rows)}
        for row in range(len(batch)):
            if row not in where:
                cells[row].append(None)
                continue
            i = where[row]
            kept = min(rnd.accepted[i], rnd.committed[i])  # accepted drafts that were committed (EOS may cut)
            own = rnd.committed[i] - kept
            cells[row].append({"kept": kept, "own": own, "rejected": rnd.drafted[i] - rnd.accepted[i],
                               "pad": width - rnd.drafted[i] - 1, "width": width})
    return cells


def lanes_html(batch: BatchTrace | None, selected: int | None = None) -> str:
    if batch is None or not batch.rounds:
        return '<div class="bt-lanes"><p>Run a batch to see its rows race: one lane per prompt.</p></div>'
    if not batch.totals:
        batch.summarize()
    keys = "".join(f'<span class="bt-key" title="{html.escape(tip, quote=True)}">{_slot(kind, tip)} {label}</span>'
                   for kind, label, tip in _KEYS)
    lanes = []
    for row, cells in enumerate(lane_cells(batch)):
        blocks = []
        for index, cell in enumerate(cells):
            if cell is None:
                blocks.append('<span class="bt-gone" title="this row had left the batch"></span>')
                continue
            slots = ([_slot("kept", f"round {index + 1}: an accepted draft token, kept")] * cell["kept"]
                     + [_slot("own", f"round {index + 1}: the target's own token (bonus, replacement or plain step)")]
                     * cell["own"]
                     + [_slot("rejected", f"round {index + 1}: a draft the target verified and rejected; its cache "
                                          "slot became padding for this row only")] * cell["rejected"]
                     + [_slot("pad", f"round {index + 1}: padding: this row had fewer tokens to score than the "
                                     f"longest row ({cell['width']} slots in the batched forward)")] * cell["pad"])
            blocks.append(f'<span class="bt-round">{"".join(slots)}</span>')
        trace = batch[row]
        tau = (batch.totals.get("tau") or [None] * len(batch))[row] if batch.totals else None
        tokens = len(trace.output_ids)
        done = {"eos": "ended at EOS", "max_new_tokens": "reached its max tokens", "cancelled": "stopped"}.get(
            trace.stop_reason, "decoding")
        shown = "–" if tau is None else f"{tau:.2f}"
        made = counted(tokens, "token")
        count = (f'<span class="bt-count" title="{made} generated by this row; τ = tokens per target '
                 f'forward it took part in ({done})">{tokens} tok · τ {shown}</span>')
        chosen = " bt-selected" if row == selected else ""
        lanes.append(f'<button class="bt-lane{chosen}" data-row="{row}" title="row {row + 1}: click to open its '
                     f'rounds below">'
                     f'<span class="bt-name">row {row + 1}</span>{count}<span class="bt-track">{"".join(blocks)}</span>'
                     '</button>')  # the count before the track: a long lane scrolls, its numbers stay in view
    return f'<div class="bt-lanes"><div>{keys}</div>{scroll_box("".join(lanes), "rounds")}</div>'


_KEYS = (("kept", "accepted draft", "a draft token the target accepted (kept)"),
         ("own", "target's token", "the one token the target adds each round (bonus, replacement, or a plain step)"),
         ("rejected", "rejected draft", "a draft the target rejected; its slot turns into padding for this row"),
         ("pad", "padding", "a slot this row sat out in the batched forward because another row had more to score"))


def batch_stats_html(batch: BatchTrace | None) -> str:
    if batch is None or not batch.rounds:
        return ""
    t = batch.totals or batch.summarize()
    rate = t.get("tokens_per_second")
    share = t.get("realign_share")
    cards = [
        ("total tokens/s", "–" if rate is None else f"{rate:.1f}",
         "every row's generated tokens ÷ the batch's decode seconds (prefill excluded); the batch's throughput"),
        ("rows", str(t["batch"]), "prompts decoded together in one batch"),
        ("rounds", str(t["rounds"]), "batched target forwards; each row takes part until it finishes"),
        ("realignment", "–" if share is None else f"{100 * share:.1f}%",
         f"share of decode time spent realigning the caches after rounds (trimming padding, compacting, dropping "
         f"finished rows): {t['realign_seconds'] * 1000:.0f} ms"),
        ("padding written", str(t["padding_added"]),
         "cache slots written as padding (prompts of different lengths, rows with fewer drafts in a round)"),
    ]
    taus = " · ".join(f'<span title="row {i + 1}: τ = tokens ÷ target forwards it took part in">row {i + 1} '
                      f'{"–" if x is None else f"{x:.2f}"}</span>' for i, x in enumerate(t["tau"]))
    body = "".join(f'<div class="sl-card" title="{html.escape(tip, quote=True)}"><div class="sl-value">{value}</div>'
                   f'<div class="sl-label">{label} <span class="sl-q">?</span></div></div>'
                   for label, value, tip in cards)
    return f'<div class="sl-cards">{body}</div><p class="sl-note">τ per row: {taus}</p>'


# --- throughput: tokens/s against B ---

def throughput_figure(rows: list[dict], title: str = "", height: int = 360) -> go.Figure:
    """rows: {method, batch, tokens_per_second} (bench/batch.py's rows of one prompt set, or a run on the spot)."""
    if not rows:
        return empty_figure("No throughput figures yet: press 'Measure here' or install the recorded results "
                            "(bench/results/batch-*.json).", height)
    fig = go.Figure()
    colors = [OKABE_ITO["sky blue"], OKABE_ITO["bluish green"], OKABE_ITO["vermillion"], OKABE_ITO["reddish purple"]]
    for color, method in zip(colors, dict.fromkeys(r["method"] for r in rows)):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["batch"])
        fig.add_trace(go.Scatter(
            x=[r["batch"] for r in mine], y=[r["tokens_per_second"] for r in mine], name=_name(method),
            mode="lines+markers", line=dict(color=color), marker=dict(size=9),
            hovertemplate=f"{_name(method)}<br>B = %{{x}} rows<br>%{{y:.1f}} tokens/s in total (all rows' tokens ÷ "
                          "the batch's decode seconds)<extra></extra>"))
    text = wrap_title(title or "Total tokens/s against batch size B")
    fig.update_layout(height=height, title=dict(text=text, font=dict(size=14)), plot_bgcolor="white",
                      margin=dict(l=50, r=10, t=title_margin(text), b=40), legend=legend_below(),
                      xaxis=dict(title="B (rows decoded together)", type="log", tickvals=[1, 2, 4, 8],
                                 gridcolor="#eee"),
                      yaxis=dict(title="total tokens/s", gridcolor="#eee", rangemode="tozero"))
    best = max(rows, key=lambda r: r["tokens_per_second"])
    return describe(fig, f"Tokens per second against batch size; highest: {_name(best['method'])} at B = "
                         f"{best['batch']}, {best['tokens_per_second']:.1f} tokens/s.")


def _name(method: str) -> str:
    return {"baseline": "batched baseline", "prompt-lookup": "batched speculative · prompt lookup",
            "draft-model": "batched speculative · draft model", "layer-skip": "batched speculative · layer skip"
            }.get(method, method)


def why_sentences(rows: list[dict], grid: list[dict] | None = None) -> list[str]:
    """One sentence per B: does batched speculative decoding beat the batched baseline here, and why (τ against
    what a forward over more tokens per row costs on this machine, t(n·B) when measured)."""
    by = {(r["batch"], r["method"]): r for r in rows}
    out = []
    for b in sorted({r["batch"] for r in rows}):
        base = by.get((b, "baseline"))
        spec = [r for r in rows if r["batch"] == b and r["method"] != "baseline"]
        if not base or not spec:
            continue
        best = max(spec, key=lambda r: r["tokens_per_second"])
        ratio = best["tokens_per_second"] / base["tokens_per_second"]
        taus = [t for t in best.get("tau") or [] if t]
        tau = sum(taus) / len(taus) if taus else None
        cost = _cost(grid, b)
        verdict = "wins" if ratio >= 1.0 else "loses"
        reason = (f"each round keeps τ = {tau:.2f} tokens per row" if tau else "its rounds keep few tokens per row")
        if cost is not None:
            reason += f", while scoring 5 tokens per row in a {b}-row forward costs {cost:.2f}× a 1-token one here"
        out.append(f"B = {b}: {_name(best['method'])} {verdict} ({ratio:.2f}× the batched baseline's tokens/s): "
                   f"{reason}.")
    return out


def _cost(grid: list[dict] | None, b: int) -> float | None:
    if not grid:
        return None
    cell = {(g["batch"], g["n"]): g["seconds"] for g in grid}
    if (b, 5) in cell and (b, 1) in cell:
        return cell[(b, 5)] / cell[(b, 1)]
    return None
