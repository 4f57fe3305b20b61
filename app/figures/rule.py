"""The draft-length rule's internals (pure): per drafted position the entropy or confidence, the bound and λ with
the stop marked, and λ / running acceptance / drafted length over rounds.

AdaEDL stops before position j (j > 1) when the bound 1 − sqrt(γ·H(q)) falls below λ; max-confidence stops when
max q falls below λ. Static and heuristic rules only choose a length; their panel shows the length per round.
"""
from __future__ import annotations

import plotly.graph_objects as go

from decoders.trace import Trace

from app.figures.tree import empty_figure
from app.shared.words import counted
from app.shared.theme import OKABE_ITO, STATUS_COLORS, describe, legend_below, title_margin, wrap_title

ADAPTIVE = ("adaedl", "max-confidence")


def rule_name(trace: Trace) -> str | None:
    return (trace.options or {}).get("rule") if trace.method == "speculative" else None


def positions_figure(trace: Trace, index: int | None = None, height: int = 340) -> go.Figure:
    """Per drafted position of round `index`: the judged quantity, the stop bound and λ, the stop marked; for a
    round whose cap the draft controller chose, its expected-gain curve instead (controller_figure)."""
    name = rule_name(trace)
    if trace.rounds and _controller(trace.rounds[_clamp(trace, index)]):
        return controller_figure(trace, _clamp(trace, index), height)
    if name not in ADAPTIVE:
        text = "The baseline drafts nothing." if name is None else \
            f"Rule '{name}' picks a length up front; it has no per-position stop test (try AdaEDL)."
        return empty_figure(text, height)
    if not trace.rounds:
        return empty_figure("No rounds yet.", height)
    index = len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))
    rnd = trace.rounds[index]
    checks = (rnd.rule or {}).get("checks") or []
    if not checks:
        return empty_figure(f"Round {index + 1}: no per-position checks recorded.", height)
    pos = [c["position"] for c in checks]
    lam = [c.get("lam") for c in checks]
    bound = [c.get("bound") for c in checks]
    fig = go.Figure()
    if name == "adaedl":
        ent = [c.get("entropy") for c in checks]
        fig.add_trace(go.Bar(x=pos, y=ent, name="entropy H(q) (nats)", marker_color="#cfe3f1", width=0.5,
                             hovertemplate="position %{x}<br>draft entropy H(q) = %{y:.3f} nats<extra></extra>"))
        bound_name = "bound 1 − √(γ·H)"
        bound_help = "AdaEDL's lower bound on the acceptance probability"
    else:
        bound_name = "confidence max q"
        bound_help = "the draft's top probability"
    fig.add_trace(go.Scatter(x=pos, y=bound, mode="lines+markers", name=bound_name, line=dict(color=OKABE_ITO["blue"]),
                             yaxis="y2",
                             hovertemplate=f"position %{{x}}<br>{bound_help} = %{{y:.3f}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=pos, y=lam, mode="lines+markers", name="threshold λ", yaxis="y2",
                             line=dict(color="#555", dash="dash"), marker=dict(size=4),
                             hovertemplate="position %{x}<br>λ = %{y:.3f} (stop if the bound falls below it)"
                                           "<extra></extra>"))
    stops = [c for c in checks if c.get("stop")]
    if stops:
        fig.add_trace(go.Scatter(
            x=[c["position"] for c in stops], y=[c.get("bound") for c in stops], mode="markers", name="stop",
            yaxis="y2",
            marker=dict(symbol="x", size=16, color=STATUS_COLORS["rejected"], line=dict(width=2)),
            hovertemplate="stopped before drafting position %{x}: bound %{y:.3f} < λ<extra></extra>"))
    title = wrap_title(f"Round {index + 1}: why drafting stopped where it did", 36)
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)),
        height=height, margin=dict(l=10, r=10, t=title_margin(title), b=10), plot_bgcolor="white", barmode="overlay",
        legend=legend_below(font=dict(size=11)),
        xaxis=dict(title="draft position", dtick=1, showgrid=False),
        yaxis=dict(title="entropy (nats)", side="right", showgrid=False, rangemode="tozero",
                   visible=name == "adaedl"),
        yaxis2=dict(title="bound / λ", range=[min(0.0, *[b for b in bound if b is not None]) - 0.05, 1.05],
                    overlaying="y", side="left", gridcolor="#eee"),
    )
    return describe(fig, positions_summary(name, index, checks))


def _clamp(trace: Trace, index: int | None) -> int:
    return len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))


def _controller(rnd) -> dict | None:
    return (rnd.rule or {}).get("controller")


def controller_sentence(rnd) -> str:
    """"Cap 14: expected 1.92 tokens per unit cost; 16 would give 1.88" (unit = one target step)."""
    decision = _controller(rnd)
    gain, cap = decision["gain"], decision["cap"]
    other = min(cap + 2, len(gain) - 1) if cap + 2 < len(gain) else max(cap - 2, 0)
    tail = f"; {other} would give {gain[other]:.2f}" if other != cap else ""
    if decision.get("calibrated_by") == "drafter":  # suffix decoding: nodes copied from the text, no forward
        if not cap:
            return (f"sent none of the {decision.get('of', '?')} copied candidates: the plain step gains most "
                    f"({gain[0]:.2f} tokens per unit cost{tail})")
        return (f"sent {cap} of the {decision.get('of', '?')} copied candidates: expected {gain[cap]:.2f} tokens "
                f"per unit cost{tail}")
    if "m" in decision:  # a tree: the controller chose how many of the grown nodes to send
        return (f"sent {cap} of the grown nodes after {counted(decision['steps'], 'draft forward')}: expected "
                f"{gain[cap]:.2f} "
                f"tokens per unit cost{tail}")
    head = (f"probe: drafted up to 1 although drafting nothing gains most ({gain[0]:.2f})" if decision.get("probe")
            else f"cap {cap}: expected {gain[cap]:.2f} tokens per unit cost")
    stopped = f"; drafted {rnd.n_drafted}" + (" (the rule stopped inside the cap)" if rnd.n_drafted < cap else "")
    through = decision.get("overruled", 0)  # doubtful positions the controller found worth drafting
    priced = f", {through} of them where the rule would have stopped" if through else ""
    past = decision.get("extended", 0)  # positions past the cap: the rule was sure and a sure token paid
    extended = f", {past} past the cap (the rule sure of each, each paying)" if past else ""
    return head + tail + stopped + priced + extended


def _gain_hovers(decision: dict, gain: list[float]) -> list[str]:
    """Each point's hover: what it expects, and the acceptance behind it (a chain: the chance at that depth once the
    drafts above it were taken; a tree: its calibration)."""
    unit = f"unit = one target step; c = {decision['c']:.3f}"
    if "alpha" in decision:
        depth = decision.get("by_depth") or []
        return [f"{x}: expected {y:.3f} tokens per unit cost ({unit}; overall α = {decision['alpha']:.2f}"
                + (f", α at depth {x} once the drafts above were taken = {depth[x - 1]:.2f}" if 0 < x <= len(depth)
                   else "") + ")" for x, y in enumerate(gain)]
    calibration = ("the drafter's calibrated chances" if decision.get("calibrated_by") == "drafter"
                   else f"calibration κ = {decision.get('kappa', 1):.2f}")
    return [f"{x}: expected {y:.3f} tokens per unit cost ({unit}; {calibration})" for x, y in enumerate(gain)]


def controller_figure(trace: Trace, index: int, height: int = 340) -> go.Figure:
    """The controller's choice in one round: expected tokens per unit cost for every cap L, the chosen one marked."""
    rnd = trace.rounds[index]
    decision = _controller(rnd)
    gain = decision["gain"]
    caps = list(range(len(gain)))
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=caps, y=gain, mode="lines+markers", name="expected tokens per unit cost", line=dict(color=OKABE_ITO["blue"]),
        marker=dict(size=5), hovertext=_gain_hovers(decision, gain), hovertemplate="%{hovertext}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[decision["cap"]], y=[gain[decision["cap"]]], mode="markers", name="chosen cap",
        marker=dict(symbol="star", size=16, color=STATUS_COLORS["accepted"], line=dict(width=1, color="#333")),
        hovertemplate="chosen: cap %{x}, %{y:.3f} tokens per unit cost<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#888", dash="dot"), annotation_text="baseline = 1",
                  annotation_position="bottom right")
    title = wrap_title(f"Round {index + 1}: {controller_sentence(rnd)}", 40)
    fig.update_layout(
        title=dict(text=title, font=dict(size=13)), height=height,
        margin=dict(l=10, r=10, t=title_margin(title), b=10), plot_bgcolor="white",
        legend=legend_below(font=dict(size=11)),
        xaxis=dict(title="tree nodes sent M" if "m" in decision else "draft cap L (tokens)", showgrid=False),
        yaxis=dict(title="(1 + κΣv) / (steps·c + t(M+1))" if "m" in decision else "E[tokens] / (L·c + t(L+1))",
                   gridcolor="#eee", rangemode="tozero"))
    return describe(fig, f"Round {index + 1}, draft controller: {controller_sentence(rnd)}; c = {decision['c']:.3f}, "
                         f"t(n) from this machine's measured curve; gain per choice: "
                         + ", ".join(f"{L}: {g:.2f}" for L, g in enumerate(gain)) + ".")


def positions_summary(name: str, index: int, checks: list[dict]) -> str:
    """The per-position panel in words (its text alternative)."""
    judged = "entropy" if name == "adaedl" else "confidence"
    cells = [f"position {c['position']}: {judged} {_num(c.get(judged))}, bound {_num(c.get('bound'))}, "
             f"λ {_num(c.get('lam'))}{' → stop' if c.get('stop') else ''}" for c in checks]
    return f"Round {index + 1}, {name} checks per drafted position: " + "; ".join(cells) + "."


def _num(value) -> str:
    return "—" if value is None else f"{value:.3g}"


def rounds_figure(trace: Trace, index: int | None = None, height: int = 340) -> go.Figure:
    """Over rounds: drafted and accepted counts; for AdaEDL / max-confidence also λ and the running acceptance."""
    name = rule_name(trace)
    if name is None:
        return empty_figure("The baseline has no draft-length rule.", height)
    if not trace.rounds:
        return empty_figure("No rounds yet.", height)
    xs = [r.index + 1 for r in trace.rounds]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[r.n_drafted for r in trace.rounds], name="drafted", marker_color="#c7c7c7",
                         hovertemplate="round %{x}: %{y} tokens drafted<extra></extra>", yaxis="y2"))
    fig.add_trace(go.Bar(x=xs, y=[r.n_accepted for r in trace.rounds], name="accepted",
                         marker_color=STATUS_COLORS["accepted"], yaxis="y2",
                         hovertemplate="round %{x}: %{y} drafts accepted<extra></extra>"))
    if name in ADAPTIVE:
        lam = [_after(r.rule, "lam") for r in trace.rounds]
        ar = [_after(r.rule, "ar") for r in trace.rounds]
        fig.add_trace(go.Scatter(x=xs, y=lam, mode="lines+markers", name="λ after the round",
                                 line=dict(color="#555"),
                                 hovertemplate="round %{x}: λ = %{y:.3f} (raised when acceptance is low)"
                                               "<extra></extra>"))
        fig.add_trace(go.Scatter(x=xs, y=ar, mode="lines", name="running acceptance AR",
                                 line=dict(color=OKABE_ITO["vermillion"], dash="dot"),
                                 hovertemplate="round %{x}: running acceptance ratio AR = %{y:.3f} "
                                               "(target α = 0.9)<extra></extra>"))
    caps = [(_controller(r) or {}).get("cap") for r in trace.rounds]
    if any(cap is not None for cap in caps):
        fig.add_trace(go.Scatter(x=xs, y=caps, mode="lines", name="cap (the controller's plan)", yaxis="y2",
                                 line=dict(color=OKABE_ITO["orange"], shape="hv"),
                                 hovertemplate="round %{x}: the controller planned %{y} drafts; past the plan a "
                                               "round drafts on only while the rule is sure and it pays"
                                               "<extra></extra>"))
    if index is not None and 0 <= int(index) < len(xs):
        fig.add_vline(x=int(index) + 1, line=dict(color="#000", width=1.5, dash="dot"))
    title = "Draft length over rounds" + ("<br>with λ and running acceptance" if name in ADAPTIVE else "")
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)),
        height=height, margin=dict(l=10, r=10, t=title_margin(title), b=10), plot_bgcolor="white", barmode="overlay",
        legend=legend_below(font=dict(size=11)),
        xaxis=dict(title="round", showgrid=False),
        yaxis=dict(title="λ / AR", range=[0, 1.05], gridcolor="#eee", visible=name in ADAPTIVE),
        yaxis2=dict(title="tokens", overlaying="y", side="right", showgrid=False, rangemode="tozero"),
    )
    return describe(fig, rounds_summary(trace, name, index))


def rounds_summary(trace: Trace, name: str, index: int | None) -> str:
    """The over-rounds panel in words (its text alternative)."""
    drafted = sum(r.n_drafted for r in trace.rounds)
    accepted = sum(r.n_accepted for r in trace.rounds)
    text = (f"{counted(len(trace.rounds), 'round')} with rule {name}: {counted(drafted, 'token')} drafted, "
            f"{accepted} accepted; "
            f"drafted per round: {', '.join(str(r.n_drafted) for r in trace.rounds)}.")
    if name in ADAPTIVE and trace.rounds:
        text += f" λ after the last round: {_num(_after(trace.rounds[-1].rule, 'lam'))}."
    if index is not None and 0 <= int(index) < len(trace.rounds):
        text += f" Round {int(index) + 1} is marked."
    return text


def _after(rule: dict | None, key: str):
    """The rule's state after a round (the trace writes lam/ar; lam_after/ar_after in the documented form)."""
    rule = rule or {}
    return rule.get(f"{key}_after", rule.get(key))
