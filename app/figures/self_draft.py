"""Where a learned self-drafter drafts from inside the target (pure: trace in, figure out).

Early exit: the target's layers 1..k run once per token and are shared (the draft writes their cache, verification
reuses it), then the trained exit block and the LM head make the draft; layers k+1..L run only in verification.
Prophet: every target layer runs in verification; its last hidden state feeds the small trained decoder, which
drafts on its own. Reads trace.totals["self_draft"] (decoders/drafters/early_exit.py, prophet.py summary()).
"""
from __future__ import annotations

import plotly.graph_objects as go

from decoders.trace import Trace

from app.shared.theme import OKABE_ITO, describe, legend_below, title_margin, wrap_title

COLORS = {"shared": OKABE_ITO["sky blue"], "verify": "#BBBBBB", "block": OKABE_ITO["orange"],
          "head": OKABE_ITO["bluish green"]}


def self_draft_info(trace: Trace | None) -> dict | None:
    info = (trace.totals or {}).get("self_draft") if trace is not None else None
    return info if isinstance(info, dict) and info.get("kind") in ("early-exit", "prophet") else None


def _box(fig, x0, x1, y0, y1, color, text, hover, name, legend):
    fig.add_trace(go.Scatter(x=[x0, x1, x1, x0, x0], y=[y0, y0, y1, y1, y0], fill="toself", fillcolor=color,
                             line=dict(color="#333", width=1), mode="lines", name=name, legendgroup=name,
                             showlegend=legend, hoveron="fills", text=hover, hoverinfo="text"))
    if text:
        fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=text, showarrow=False, font=dict(size=10))


def _number(i: int, total: int) -> str:
    """Every layer's number when they fit, else 1 and every fifth (a phone-width plot has ~12 px per layer)."""
    return str(i) if total <= 12 or i == 1 or i % 5 == 0 else ""


def exit_figure(trace: Trace | None) -> go.Figure | None:
    """None for traces of other drafters."""
    info = self_draft_info(trace)
    if info is None:
        return None
    total = int(info["target_layers"])
    fig = go.Figure()
    if info["kind"] == "early-exit":
        k = int(info["exit_layer"])
        reused = info.get("reused_layer_tokens", 0)
        for i in range(1, total + 1):
            shared = i <= k
            hover = (f"target layer {i}: shared. It runs once per token, while drafting; its KV cache and output "
                     f"are reused by verification ({reused:,} token x layer passes not repeated in this run)"
                     if shared else f"target layer {i}: skipped by the draft, runs only in verification (over the "
                     f"draft's layer-{k} outputs)")
            _box(fig, i - 1, i - 0.1, 0, 1, COLORS["shared" if shared else "verify"], _number(i, total), hover,
                 "layers 1..k: shared" if shared else "layers k+1..L: verification only", i in (1, k + 1))
        _box(fig, k - 0.5, k + 1.5, 1.4, 2.4, COLORS["block"], "exit<br>block",
             f"the trained exit block (one decoder layer of its own) reads layer {k}'s output", "trained block", True)
        _box(fig, k + 1.9, k + 4.4, 1.4, 2.4, COLORS["head"], "LM<br>head",
             "the target's final norm (a trained copy) and its own LM head turn the block's output into the draft "
             "distribution q", "LM head", True)
        title = f"Early exit after layer {k} of {total}: layers 1..{k} shared, {total - k} verification-only"
        summary = (f"Early-exit draft: target layers 1 to {k} are shared with verification, then a trained block and "
                   f"the LM head; layers {k + 1} to {total} run only to verify.")
    else:
        n = int(info["block_layers"])
        for i in range(1, total + 1):
            _box(fig, i - 1, i - 0.1, 0, 1, COLORS["verify"], _number(i, total),
                 f"target layer {i}: runs in verification; the last one's hidden state seeds the prophet",
                 "target layers (verification)", i == 1)
        _box(fig, total - 3, total + 0.5, 1.4, 2.4, COLORS["block"], f"prophet<br>{n} layer{'s' if n > 1 else ''}",
             "the trained prophet: its first input is the target's last hidden state (projected); it then drafts "
             "on its own, with no other context", "trained prophet", True)
        _box(fig, total + 0.9, total + 3.4, 1.4, 2.4, COLORS["head"], "LM<br>head",
             "the target's own LM head turns the prophet's output into the draft distribution q", "LM head", True)
        title = f"Prophet: drafts from the target's last hidden state (layer {total}) with {n} layer(s) of its own"
        summary = f"Prophet draft: a {n}-layer trained decoder fed by the target's last hidden state."
    title = wrap_title(title)
    fig.update_layout(title=dict(text=title, font=dict(size=13)), height=250,
                      margin=dict(l=10, r=10, t=title_margin(title), b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, range=[-0.2, 2.6]),
                      legend=legend_below(font=dict(size=10)), plot_bgcolor="white")
    return describe(fig, summary)
