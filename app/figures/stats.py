"""Run statistics (pure): the numbers users know from vLLM / llama.cpp, each explained on hover.

τ = output tokens / target forwards (includes the bonus token); acceptance rate = accepted / drafted;
per-position acceptance; accepted-length histogram; tokens/s over the decode phase; draft / verify / bookkeeping
time; target and draft forward counts. Works on live (unfinished) traces: totals are recomputed.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from decoders.stats import summarize
from decoders.trace import Trace

from app.shared.theme import OKABE_ITO, STATUS_COLORS, describe, stop_words

from .runtime import runtime_html


def totals(trace: Trace) -> dict:
    """trace.totals when the run finished, else a fresh summary of the rounds so far."""
    return trace.totals if trace.stop_reason and trace.totals else summarize(trace)


def _num(value, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def _card(label: str, value: str, help_text: str) -> str:
    tip = html.escape(help_text, quote=True)
    return (f'<div class="sl-card" title="{tip}"><div class="sl-value">{html.escape(value)}</div>'
            f'<div class="sl-label">{html.escape(label)} <span class="sl-q">?</span></div></div>')


def verdict_line(trace: Trace) -> str:
    """A plain sentence about whether speculation did anything."""
    t = totals(trace)
    if trace.method != "speculative":
        return "Baseline: one target forward per token, no drafts."
    if not t["rounds"]:
        return ""
    if t["drafted"] == 0:
        return "No drafts were offered: every token came from a plain target step (speculation did nothing)."
    if t["accepted"] == 0:
        return (f"0 drafts accepted (of {t['drafted']} drafted): speculation did nothing; every token came from "
                "the target, and the drafting was pure overhead.")
    return (f"{t['accepted']} of {t['drafted']} drafted tokens accepted: the target produced {t['tokens']} tokens "
            f"in {t['target_forwards']} forwards.")


def stats_html(trace: Trace) -> str:
    """Cards with hover explanations, a verdict line, and the precision note."""
    t = totals(trace)
    secs = t.get("seconds") or {}
    spent = sum(secs.values()) or 0.0
    split = " / ".join(f"{100 * secs.get(k, 0.0) / spent:.0f}%" if spent else "—"
                       for k in ("draft", "verify", "bookkeeping"))
    running = "" if trace.stop_reason else " (running)"
    cards = [
        _card("τ (mean acceptance length)", _num(t["tau"]),
              "τ = output tokens ÷ target forwards. It counts the target's own (bonus/resampled) token, so the "
              "baseline has τ = 1 and every accepted draft adds to it."),
        _card("draft acceptance rate", _num(t["acceptance_rate"], "{:.0%}"),
              "accepted draft tokens ÷ drafted tokens (vLLM's definition)."),
        _card("tokens / s", _num(t["tokens_per_second"], "{:.1f}"),
              "output tokens ÷ decode seconds (after the prompt prefill). Live runs include the cost of "
              "streaming to the browser; the Race tab measures without it."),
        _card("tokens", str(t["tokens"]), "generated tokens (prompt excluded)"),
        _card("target forwards", str(t["target_forwards"]),
              "target model forward passes, one per round (each verifies all drafts of the round at once)."),
        _card("draft forwards", str(t["draft_forwards"]),
              "draft model forward passes (0 for prompt lookup, which copies tokens instead of running a model)."),
        _card("decode time", _num(t["decode_seconds"], "{:.2f} s"),
              f"wall time after the prefill; prefill took {_num(t['prefill_seconds'], '{:.2f} s')}."),
        _card("draft / verify / bookkeeping", split,
              "share of round time spent drafting, in the target's verification forward, and committing / "
              "rolling back caches and recording the trace."),
    ]
    stop = stop_words(trace.stop_reason) if trace.stop_reason else "running…"
    target = (trace.models or {}).get("target") or {}
    draft = (trace.models or {}).get("draft") or {}
    who = f"{target.get('name', '?')} ({target.get('dtype', '?')})" + (
        f" + draft {draft.get('name')} ({draft.get('dtype', '?')})" if draft else "")
    return (
        f'<div class="sl-stats"><div class="sl-head"><b>{html.escape(trace.label)}</b> · {html.escape(who)} · '
        f'{html.escape(stop)}{running}</div>'
        f'<div class="sl-verdict">{html.escape(verdict_line(trace))}</div>'
        f'<div class="sl-cards">{"".join(cards)}</div>'
        f'<div class="sl-precision" title="What the number format means for losslessness">'
        f'Precision: {html.escape(trace.precision)}</div>{runtime_html(trace)}</div>'
    )


def stats_figure(trace: Trace, height: int = 640) -> go.Figure:
    """Per-position acceptance, accepted-length histogram, and the time split, stacked (so each keeps the full
    width of the column, on a phone too), every axis titled and the time split with its legend."""
    t = totals(trace)
    fig = make_subplots(rows=3, cols=1, row_heights=[0.4, 0.4, 0.2], vertical_spacing=0.17,
                        subplot_titles=("Acceptance by draft position", "Accepted drafts per round",
                                        "Where the decode time went"))
    per_pos = t.get("per_position_acceptance") or []
    fig.add_trace(go.Bar(x=list(range(1, len(per_pos) + 1)), y=per_pos, marker_color=STATUS_COLORS["accepted"],
                         name="per-position acceptance", showlegend=False,
                         hovertemplate="position %{x}: accepted in %{y:.0%} of the rounds that drafted it"
                                       "<extra></extra>"), row=1, col=1)
    hist = t.get("accepted_histogram") or []
    fig.add_trace(go.Bar(x=list(range(len(hist))), y=hist, marker_color=OKABE_ITO["blue"], showlegend=False,
                         name="accepted-length histogram",
                         hovertemplate="%{y} rounds accepted exactly %{x} drafts<extra></extra>"), row=2, col=1)
    secs = t.get("seconds") or {}
    for key, color, pattern in TIME_PARTS:
        fig.add_trace(go.Bar(x=[secs.get(key, 0.0)], y=["time"], orientation="h", name=key, marker_color=color,
                             marker_pattern_shape=pattern,
                             hovertemplate=f"{key}: %{{x:.3f}} s<extra></extra>"), row=3, col=1)
    fig.update_layout(height=height, showlegend=True, barmode="stack", plot_bgcolor="white",
                      legend=dict(orientation="h", x=0, y=-0.08, yanchor="top", title_text="time: "),
                      margin=dict(l=10, r=10, t=70, b=10))
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", title_text="accepted", row=1, col=1, gridcolor="#eee")
    fig.update_xaxes(dtick=1, title_text="draft position", row=1, col=1)
    fig.update_yaxes(title_text="rounds", gridcolor="#eee", row=2, col=1)
    fig.update_xaxes(dtick=1, title_text="drafts accepted in the round", row=2, col=1)
    fig.update_yaxes(showticklabels=False, row=3, col=1)
    fig.update_xaxes(title_text="seconds", row=3, col=1, gridcolor="#eee")
    fig.update_annotations(font_size=13)
    return describe(fig, stats_summary(t))


# The time split's parts: colour and a fill pattern, so the parts differ without colour vision too.
TIME_PARTS = (("draft", OKABE_ITO["sky blue"], "/"), ("verify", OKABE_ITO["blue"], ""),
              ("bookkeeping", "#bbbbbb", "."))


def stats_summary(t: dict) -> str:
    """The statistics chart in words (its text alternative)."""
    per_pos = ", ".join(f"{v:.0%}" for v in t.get("per_position_acceptance") or []) or "none"
    hist = t.get("accepted_histogram") or []
    counts = ", ".join(f"{n} round{'s' if n != 1 else ''} accepted {k}" for k, n in enumerate(hist) if n) or "none"
    secs = t.get("seconds") or {}
    split = ", ".join(f"{key} {secs.get(key, 0.0):.2f} s" for key, _, _ in TIME_PARTS)
    return (f"Acceptance by draft position: {per_pos}. Accepted drafts per round: {counts}. "
            f"Decode time: {split}.")


STATS_CSS = """
.sl-stats { font-size: 14px; }
.sl-head { margin-bottom: 4px; }
.sl-verdict { margin: 4px 0 8px; font-weight: 600; }
.sl-cards { display: flex; flex-wrap: wrap; gap: 8px; }
.sl-card { border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 6px 10px;
           min-width: 120px; cursor: help; }
.sl-value { font-size: 20px; font-weight: 700; }
.sl-label { font-size: 12px; opacity: 0.8; }
.sl-q { display: inline-block; width: 13px; height: 13px; line-height: 13px; border-radius: 50%; font-size: 10px;
        text-align: center; border: 1px solid currentColor; opacity: 0.55; margin-left: 2px; }
.sl-precision, .sl-runtime { margin-top: 8px; font-size: 12px; opacity: 0.85; cursor: help; }
.sl-error { color: #b00020; font-weight: 600; }
"""
