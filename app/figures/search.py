"""What a tree drafter's search did (EAGLE-2, DDD), drawn from the trace's RoundRecord.search (pure: no models).

Per round: the candidate pool grown step by step, the M most valuable nodes sent to the target, the frontier's
confidence H = logsumexp(log-values) at each expansion step and, for DDD, the checks it made against x and where it
stopped. Over the run: EAGLE-2's calibration claim (a node's value, the product of draft probabilities on its path,
estimates the chance the target accepts the whole path) set against what the target accepted, and how many drafts
each round accepted. Every number comes from the trace; H between DDD's checks is recomputed from the recorded
frontier values (the same formula DDD uses) and says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from decoders.options import TREE_DRAFTERS
from decoders.trace import RoundRecord, Trace

from app.figures import suffix
from app.shared.words import counted
from app.shared.theme import OKABE_ITO, STATUS_COLORS, describe, empty_figure, legend_below, sig, title_margin, \
    wrap_title

METHOD_NAMES = {"eagle2": "EAGLE-2", "ddd": "DDD"}
CALIBRATION_EDGES = (0.0, 0.01, 0.03, 0.1, 0.3, 0.6, 1.0)  # value buckets: most of the pool is far below 0.1


def is_tree_trace(trace: Trace) -> bool:
    """A run by a tree drafter: its rounds carry the search that grew each tree."""
    drafter = (trace.options or {}).get("drafter")
    return trace.method == "speculative" and (drafter in TREE_DRAFTERS or any(r.search for r in trace.rounds))


def method_name(trace: Trace) -> str:
    drafter = (trace.options or {}).get("drafter", "")
    grower = "EAGLE head" if (trace.options or {}).get("eagle_head") else "draft model"
    return f"{METHOD_NAMES.get(drafter, drafter)} ({grower})"


@dataclass
class PoolView:
    """One round's pool seen from the verified tree: tree node id -> its pool entry, the candidates that were not
    sent grouped under their nearest sent ancestor (tree node id; 0 = the root), and each pool entry's value rank."""
    entry: dict[int, dict]
    unsent: dict[int, list[dict]]
    rank: dict[int, int]
    size: int


def pool_view(rnd: RoundRecord) -> PoolView | None:
    search = rnd.search or {}
    pool = search.get("pool") or []
    if not pool:
        return None
    by_id = {int(e["id"]): e for e in pool}
    tree_of = {int(pool_id): i + 1 for i, pool_id in enumerate(search.get("chosen") or [])}
    unsent: dict[int, list[dict]] = {}
    for entry in pool:
        if int(entry["id"]) in tree_of:
            continue
        ancestor = int(entry["parent"])
        while ancestor >= 0 and ancestor not in tree_of:  # an unsent node's own children hang where it hangs
            ancestor = int(by_id[ancestor]["parent"])
        unsent.setdefault(tree_of.get(ancestor, 0), []).append(entry)
    ranked = sorted(pool, key=lambda e: -float(e["value"]))
    return PoolView(entry={node: by_id[pool_id] for pool_id, node in tree_of.items()},
                    unsent={k: sorted(v, key=lambda e: -float(e["value"])) for k, v in unsent.items()},
                    rank={int(e["id"]): i + 1 for i, e in enumerate(ranked)}, size=len(pool))


def search_headline(trace: Trace, rnd: RoundRecord) -> str:
    """'EAGLE-2 grew 510 candidates in 6 steps and sent the 59 most valuable; 2 accepted · DDD stopped ...'."""
    search = rnd.search or {}
    if suffix.is_suffix(search):
        return suffix.headline(trace, rnd)
    pool = len(search.get("pool") or [])
    sent = len(search.get("chosen") or [])
    name = METHOD_NAMES.get((trace.options or {}).get("drafter"), "the tree drafter")
    head = (f"Round {rnd.index + 1}/{len(trace.rounds)}: {name} grew {counted(pool, 'candidate')} in "
            f"{counted(search.get('steps', 0), 'step')}, sent the {sent} most valuable; {rnd.n_accepted} accepted")
    return head + _stop_words(search)


def _stop_words(search: dict) -> str:
    stop = search.get("stop")
    if stop == "ddd":
        cut = next((c for c in search.get("ddd") or [] if c.get("stop")), None)
        if cut is not None:
            return f" · DDD stopped before step {cut['step']}: H = {sig(cut['H'])} < x = {sig(cut['x'])}"
    # not "grew": the growth panel's title reads "how the tree grew" + these words
    return {"depth": " · reached its full depth", "budget": " · stopped at the step limit"}.get(stop, "")


# ---- the growth of one round --------------------------------------------------------------------------------

def frontier_confidence(rnd: RoundRecord) -> list[tuple[int, float, int]]:
    """Per expansion step (1-based): (step, H = logsumexp of the frontier's log-values, frontier size)."""
    search = rnd.search or {}
    values = {int(e["id"]): float(e["value"]) for e in search.get("pool") or []}
    rows = []
    for step, frontier in enumerate(search.get("frontier") or [], start=1):
        logs = [math.log(values[i]) for i in frontier if values.get(i, 0.0) > 0.0]
        if logs:
            top = max(logs)
            rows.append((step, top + math.log(sum(math.exp(v - top) for v in logs)), len(frontier)))
    return rows


def growth_figure(trace: Trace, index: int | None = None, height: int = 340) -> go.Figure:
    """One round's growth: candidates added per expansion step (bars) and the frontier's confidence H (line), with
    DDD's own checks against x and the step where it stopped."""
    if not trace.rounds:
        return empty_figure("No rounds yet.", height)
    index = len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))
    rnd = trace.rounds[index]
    search = rnd.search or {}
    if not search.get("pool"):
        return empty_figure("This round drafted no tree (recorded without its search, or no room left).", height)
    steps = [int(e["step"]) for e in search["pool"]]
    added = [steps.count(s) for s in range(1, max(steps) + 1)]
    fig = go.Figure()
    # The bars sit on the primary axis (drawn underneath), H on the overlaying one (drawn on top of them).
    fig.add_trace(go.Bar(x=list(range(1, len(added) + 1)), y=added, name="candidates added", width=0.5,
                         marker_color="#e3e3e3",
                         hovertemplate="step %{x}: %{y} candidates joined the pool<extra></extra>"))
    rows = frontier_confidence(rnd)
    if rows:
        fig.add_trace(go.Scatter(x=[r[0] for r in rows], y=[r[1] for r in rows], mode="lines+markers",
                                 name="H of the frontier", line=dict(color="#555"), yaxis="y2",
                                 customdata=[[r[2]] for r in rows],
                                 hovertemplate="the frontier of step %{x}: H = logsumexp of its %{customdata[0]} "
                                               "nodes' log-values = %{y:.3f} (recomputed from the recorded values)"
                                               "<extra></extra>"))
    _add_ddd_checks(fig, search)
    title = wrap_title(f"Round {index + 1}: how the tree grew" + _stop_words(search))
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=height, plot_bgcolor="white", barmode="overlay",
        margin=dict(l=10, r=10, t=title_margin(title), b=10),
        legend=legend_below(font=dict(size=11)),
        xaxis=dict(title="expansion step (and the frontier it left)", dtick=1, showgrid=False),
        yaxis=dict(title="candidates", side="right", showgrid=False, rangemode="tozero"),
        yaxis2=dict(title="H (log-probability)", overlaying="y", side="left", gridcolor="#eee"))
    return describe(fig, growth_summary(index, search, rows))


def _add_ddd_checks(fig: go.Figure, search: dict) -> None:
    checks = search.get("ddd") or []
    if not checks:
        return
    # DDD checks before expanding step s, judging the frontier step s - 1 produced: drawn at s - 1, with that frontier.
    judged = [c["step"] - 1 for c in checks]
    fig.add_trace(go.Scatter(x=[0.5, max(judged) + 0.5], y=[float(checks[0]["x"])] * 2, mode="lines", yaxis="y2",
                             name=f"DDD's threshold x = {sig(checks[0]['x'])}",
                             line=dict(color=OKABE_ITO["vermillion"], dash="dash", width=1.5),
                             hovertemplate="x = %{y:.3f}: DDD stops growing at a check where H < x<extra></extra>"))
    fig.add_trace(go.Scatter(yaxis="y2",
        x=judged, y=[c["H"] for c in checks], mode="markers", name="DDD's checks",
        marker=dict(size=13, symbol=["x" if c.get("stop") else "circle" for c in checks],
                    color=[OKABE_ITO["vermillion"] if c.get("stop") else OKABE_ITO["blue"] for c in checks]),
        customdata=[[c["step"], "stop growing" if c.get("stop") else "keep growing"] for c in checks],
        hovertemplate="DDD's check before step %{customdata[0]}: H of this frontier = %{y:.3f} → %{customdata[1]}"
                      "<extra></extra>"))


def growth_summary(index: int, search: dict, rows: list) -> str:
    text = (f"Round {index + 1}: {counted(len(search.get('pool') or []), 'candidate')} over "
            f"{counted(search.get('steps', 0), 'step')}; "
            f"frontier H per step: {', '.join(sig(r[1]) for r in rows)}.")
    checks = search.get("ddd") or []
    if checks:
        text += " DDD's checks: " + "; ".join(f"before step {c['step']} H {sig(c['H'])} "
                                              f"{'stop' if c.get('stop') else 'go'}" for c in checks) + "."
    return text


# ---- over the run -------------------------------------------------------------------------------------------

def calibration(trace: Trace) -> list[dict]:
    """Sent nodes bucketed by value: {lo, hi, nodes, accepted (the target accepted the node's whole path), mean value}.

    EAGLE-2's premise is that value ≈ P(the path is accepted); a calibrated draft puts each bucket on the diagonal."""
    buckets = [{"lo": lo, "hi": hi, "nodes": 0, "accepted": 0, "value_sum": 0.0}
               for lo, hi in zip(CALIBRATION_EDGES, CALIBRATION_EDGES[1:])]
    for rnd in trace.rounds:
        view = pool_view(rnd)
        if view is None:
            continue
        for node in rnd.nodes[1:]:
            entry = view.entry.get(node.id)
            if entry is None:
                continue
            value = float(entry["value"])
            bucket = next(b for b in buckets if value < b["hi"] or b is buckets[-1])
            bucket["nodes"] += 1
            bucket["accepted"] += node.status == "accepted"
            bucket["value_sum"] += value
    return [{"lo": b["lo"], "hi": b["hi"], "nodes": b["nodes"], "rate": b["accepted"] / b["nodes"],
             "mean_value": b["value_sum"] / b["nodes"]} for b in buckets if b["nodes"]]


def accepted_lengths(trace: Trace) -> list[int]:
    """Rounds by accepted drafts: counts[k] = rounds that accepted exactly k."""
    lengths = [r.n_accepted for r in trace.rounds]
    return [lengths.count(k) for k in range(max(lengths, default=0) + 1)]


def run_figure(trace: Trace, index: int | None = None, height: int = 420) -> go.Figure:
    """Calibration (value vs measured acceptance, bucketed over the run) above the accepted-length histogram."""
    if not trace.rounds:
        return empty_figure("No rounds yet.", height)
    buckets = calibration(trace)
    if not buckets:
        return empty_figure("Recorded without the tree search (record=False): nothing to calibrate.", height)
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2,
                        subplot_titles=("Does value predict acceptance?", "Drafts accepted per round"))
    fig.add_trace(go.Scatter(x=[0.001, 1], y=[0.001, 1], mode="lines", line=dict(color="#999", dash="dot"),
                             name="calibrated (value = rate)", hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=[b["mean_value"] for b in buckets], y=[b["rate"] for b in buckets], mode="lines+markers",
        name="sent nodes", marker=dict(size=[8 + min(14, math.sqrt(b["nodes"])) for b in buckets],
                                       color=OKABE_ITO["blue"]),
        customdata=[[b["lo"], b["hi"], b["nodes"]] for b in buckets],
        hovertemplate="value %{customdata[0]}–%{customdata[1]} (mean %{x:.3f}): %{customdata[2]} sent nodes, "
                      "%{y:.0%} of them accepted with their whole path<extra></extra>"), row=1, col=1)
    counts = accepted_lengths(trace)
    shown = trace.rounds[max(0, min(int(index), len(trace.rounds) - 1))].n_accepted if index is not None else -1
    fig.add_trace(go.Bar(x=list(range(len(counts))), y=counts, name="rounds",
                         marker_color=STATUS_COLORS["accepted"],
                         marker_line=dict(color="#000", width=[3 if k == shown else 0 for k in range(len(counts))]),
                         hovertemplate="%{y} rounds accepted %{x} drafts<extra></extra>"), row=2, col=1)
    # Both axes start a little before their first tick, so "0%" and "0.001" do not meet in the corner (issue 24);
    # decades only on the log axis (plotly's 2 and 5 minor labels crowd a half-width plot).
    fig.update_xaxes(type="log", title_text="value (product of draft probabilities), log", row=1, col=1,
                     range=[-3.2, 0.05], tickvals=[0.001, 0.01, 0.1, 1], ticktext=["0.001", "0.01", "0.1", "1"],
                     gridcolor="#eee")
    fig.update_yaxes(title_text="accepted", range=[-0.1, 1.05], tickvals=[0, 0.5, 1], tickformat=".0%",
                     gridcolor="#eee", zeroline=False, row=1, col=1)
    fig.update_xaxes(title_text="drafts accepted (outlined: this round)", dtick=1, row=2, col=1)
    fig.update_yaxes(title_text="rounds", gridcolor="#eee", rangemode="tozero", row=2, col=1)
    fig.update_layout(height=height, plot_bgcolor="white", showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_annotations(font_size=13)
    return describe(fig, run_summary(buckets, counts))


def run_summary(buckets: list[dict], counts: list[int]) -> str:
    parts = [f"value {sig(b['lo'])}–{sig(b['hi'])}: {b['nodes']} nodes, {b['rate']:.0%} accepted" for b in buckets]
    rounds = ", ".join(f"{counted(n, 'round')} accepted {counted(k, 'draft')}" for k, n in enumerate(counts) if n)
    return "Calibration over the run: " + "; ".join(parts) + f". {rounds}."
