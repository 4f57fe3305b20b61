"""The Race tab's views (pure): a results table, a speed chart, and Leviathan's expected-speedup curve.

Leviathan et al. (2023), eq. for the expected walltime improvement of a chain draft of length γ:
    S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1))
α = the per-token acceptance probability, c = the cost of one draft forward relative to one target forward.
From the traces: γ = mean drafts per drafting round; c = (draft seconds / draft forwards) ÷ (baseline verify
seconds / baseline target forwards); α̂ solves τ = (1 − α^(γ+1)) / (1 − α) (the expected tokens per round).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from decoders.beams.trace import BeamTrace
from decoders.options import BEAM_METHODS, TREE_DRAFTERS
from decoders.stats import alpha_from_tau, expected_speedup
from decoders.trace import Trace

from app.figures.stats import totals
from app.figures.tree import empty_figure
from app.shared.theme import OKABE_ITO, describe, legend_below, scroll_box, title_margin, wrap_title


def race_row(trace: Trace | BeamTrace, baseline: Trace | None) -> dict:
    """One line of the race table (plain data)."""
    t = totals(trace)
    b = totals(baseline) if baseline is not None else None
    speed = t["tokens_per_second"]
    speedup = speed / b["tokens_per_second"] if b and speed and b["tokens_per_second"] else None
    if isinstance(trace, BeamTrace):
        return _beam_row(trace, t, baseline, speed, speedup)
    drafting = [r for r in trace.rounds if r.n_drafted > 0]
    gamma = sum(r.n_drafted for r in drafting) / len(drafting) if drafting else 0.0
    # A tree sends many drafts per round but pays per expansion step (one draft forward each): its cost is in steps.
    tree = (trace.options or {}).get("drafter") in TREE_DRAFTERS and trace.method == "speculative"
    steps = sum(r.draft_forwards for r in drafting) / len(drafting) if drafting else 0.0
    c = None
    if trace.method == "speculative" and b:
        per_target = b["seconds"]["verify"] / b["target_forwards"] if b["target_forwards"] else None
        per_draft = t["seconds"]["draft"] / t["draft_forwards"] if t["draft_forwards"] else 0.0
        c = per_draft / per_target if per_target else None
    # Leviathan's α assumes a chain of γ i.i.d. trials; a tree's τ does not invert to it.
    alpha = alpha_from_tau(t["tau"], gamma) if trace.method == "speculative" and t["tau"] and gamma and not tree \
        else None
    timed = t.get("timed_tokens_per_second") or []
    return {"label": trace.label, "method": trace.method, "tokens_per_second": speed, "speedup": speedup,
            "spread": (min(timed), max(timed)) if len(timed) > 1 else None, "timed_runs": len(timed) or 1,
            "draft": draft_description(trace),
            "tau": t["tau"], "acceptance_rate": t["acceptance_rate"], "gamma": gamma, "c": c, "alpha": alpha,
            "tree": tree, "draft_steps": steps, "peak_kv_bytes": t.get("peak_kv_bytes"),
            "identical": baseline is not None and trace.output_ids == baseline.output_ids,
            "check": trace.baseline_check if trace is not baseline else None,  # decoders/compare.py, decode side
            "tokens": t["tokens"], "greedy": float((trace.options or {}).get("temperature", 0.0)) == 0.0}


def draft_description(trace) -> str | None:
    """Which draft model raced, as the trace recorded it from the loaded draft (decoders/api.py _describe): its name
    and precision, e.g. "qwen2.5-coder-0.5b, int8 linears"; None when the run had no draft model."""
    draft = (trace.models or {}).get("draft")
    if not draft:
        return None
    kernels, dtype = draft.get("kernels"), draft.get("dtype", "?")
    fast = "fused kernels" if str(draft.get("device", "")).startswith("cuda") else "packed"
    kind = "int8 linears" if kernels == "int8" else f"{dtype}, {fast}" if kernels == "packed" else dtype
    return f"{draft.get('name', '?')}, {kind}"


def _beam_row(trace: BeamTrace, t: dict, baseline: Trace | None, speed, speedup) -> dict:
    """A beam method's line: speed and KV memory; it searches for another output, so τ, α, γ and c do not apply."""
    timed = t.get("timed_tokens_per_second") or []
    return {"label": trace.label, "method": trace.method, "tokens_per_second": speed, "speedup": speedup,
            "spread": (min(timed), max(timed)) if len(timed) > 1 else None, "timed_runs": len(timed) or 1,
            "tau": None, "acceptance_rate": None, "gamma": 0.0, "c": None, "alpha": None, "tree": False,
            "draft_steps": 0.0, "peak_kv_bytes": t.get("peak_kv_bytes"), "width": (trace.options or {}).get("width"),
            "identical": baseline is not None and trace.output_ids == baseline.output_ids, "tokens": t["tokens"],
            "greedy": float((trace.options or {}).get("temperature", 0.0)) == 0.0}


HEADERS = [
    ("method", "the decoding method and its options; under a draft-model method, the draft that raced and its "
               "precision (int8 linears where draft_quant and this machine chose them: only q changes, so the output "
               "stays the baseline's)"),
    ("tokens/s", "output tokens ÷ decode seconds of the median timed run (the range of all timed runs in "
                 "brackets), measured after a warm-up run, one method at a time"),
    ("speedup", "this method's tokens/s ÷ the baseline's tokens/s on the same prompt and machine"),
    ("τ", "mean acceptance length = output tokens ÷ target forwards (includes the bonus token)"),
    ("acceptance", "accepted draft tokens ÷ drafted tokens"),
    ("γ", "mean drafted tokens per round that drafted (a tree: the drafts sent to the target)"),
    ("c", "draft seconds per draft forward ÷ baseline target seconds per target forward"),
    ("KV memory", "the most key/value cache the run held: the target's peak plus the draft's (beams: every beam's "
                  "row), measured from the cache tensors"),
    ("same as baseline", "whether the output tokens equal the baseline's. At temperature 0 they must, up to "
                         "rounding: where the target's two best tokens nearly tie, a verification forward over "
                         "several tokens (summing in another order than one-token steps) can rank them the other "
                         "way. A difference is judged where the model ran: the position is re-scored exactly "
                         "(float64) and each run's logits are measured against it: rounding (both within what a "
                         "correct forward in this dtype gets wrong there) or mismatch (a real disagreement: a bug). "
                         "Hover a cell for the numbers"),
]


def same_cell(row: dict) -> tuple[str, str, str]:
    """(text, hover, css class) of the 'same as baseline' cell: decoders/compare.py's verdict, stored in the trace
    by the run code (app/tabs/race/runs.py), rendered here."""
    if row["method"] == "baseline":
        return "—", "", ""
    if row["method"] in BEAM_METHODS:
        return "n/a (searches for another output)", "beam methods keep several candidates and return the best; " \
            "they are not meant to equal greedy decoding", ""
    check = row.get("check") or {}
    kind = check.get("kind")
    if kind == "same":
        return "yes", "every output token equals the baseline's", "sl-same"
    if kind == "prefix":
        return "yes, as far as both went", f"every token both produced is the same; {check.get('reason', '')}", \
            "sl-same"
    if kind == "sampled":
        return "n/a (sampling)", "at temperature > 0 each run follows its own random draws; sampling is lossless " \
            "in distribution (a chi-square test in the test suite), not token for token", ""
    if kind == "rounding":
        return (f"no: rounding at token {check['position'] + 1} (exact margin {check['exact_margin']:.2g}, "
                f"{check['dtype']})", rounding_help(check), "sl-rounding")
    if kind == "mismatch":
        where = f" at token {check['position'] + 1}" if check.get("position") is not None else ""
        return (f"MISMATCH{where}", f"a real disagreement with the baseline: {check.get('reason', '')}. "
                f"{_numbers(check)}This is a bug; please report it with the trace", "sl-mismatch")
    if kind == "unclassified":
        return f"no: differs at token {check['position'] + 1}", f"not classified: {check.get('reason', '')}", ""
    return ("yes" if row.get("identical") else "no"), "", ""


def rounding_help(check: dict) -> str:
    """The hover of a rounding cell: what happened, with the exact margin and each side's measured error."""
    return (f"At token {check['position'] + 1} the target's two best tokens nearly tie. Scored exactly (float64, "
            f"same weights, same prefix), the baseline's token leads by {check['exact_margin']:.3g} (negative: "
            f"this run's leads). In {check['dtype']}, this run's verification forward was {check['run_error']:.3g} "
            f"off the exact logits of the two tokens and the baseline's one-token step {check['baseline_error']:.3g}; "
            f"a correct {check['dtype']} forward is {check['noise']:.3g} off here (measured), so both are rounding "
            f"(allowed up to {check['tolerance']:.3g}), and one of them ranked the pair the other way. Both "
            "continuations are the target's own choice at that point; from there the texts go different ways.")


def _numbers(check: dict) -> str:
    if check.get("exact_margin") is None:
        return ""
    return (f"Exact (float64) margin {check['exact_margin']:.3g}; this run's logits {check['run_error']:.3g} off the "
            f"exact ones, the baseline's {check['baseline_error']:.3g}; a correct {check['dtype']} forward is "
            f"{check['noise']:.3g} off here (allowed up to {check['tolerance']:.3g}). ")


def race_table_html(rows: list[dict]) -> str:
    if not rows:
        return "<p>Press <b>Race</b> to run the baseline and the chosen methods on the same prompt.</p>"
    head = "".join(f'<th title="{html.escape(h, quote=True)}">{html.escape(n)} <span class="sl-q">?</span></th>'
                   for n, h in HEADERS)
    body = []
    for row in rows:
        same, hover, css = same_cell(row)
        speed = _f(row["tokens_per_second"], "{:.1f}")
        if row.get("spread"):
            speed += " ({:.1f}–{:.1f})".format(*row["spread"])
        cells = [speed, _f(row["speedup"], "{:.2f}×"),
                 _f(row["tau"]), _f(row["acceptance_rate"], "{:.0%}"),
                 _f(row["gamma"] or None, "{:.1f}"), _f(row["c"], "{:.3f}"), memory_text(row.get("peak_kv_bytes"))]
        last = f'<td class="{css}" title="{html.escape(hover, quote=True)}">{html.escape(same)}</td>'
        body.append("<tr>" + method_cell(row) + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + last +
                    "</tr>")
    return scroll_box(f'<table class="sl-race"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def method_cell(row: dict) -> str:
    """The method's label and, for a draft-model run, the draft that raced (name and precision) under it."""
    if not row.get("draft"):
        return f"<td>{html.escape(row['label'])}</td>"
    hover = f"draft model: {row['draft']}, as loaded for this run (the API, the CLI and bench load it the same way)"
    return (f'<td>{html.escape(row["label"])}<br><small class="sl-race-draft" title="{html.escape(hover, quote=True)}">'
            f"draft: {html.escape(row['draft'])}</small></td>")


def _f(value, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def memory_text(value) -> str:
    if not value:
        return "—"
    return f"{value / 2 ** 10:.0f} KiB" if value < 2 ** 20 else f"{value / 2 ** 20:.1f} MiB"


def speed_figure(rows: list[dict], height: int = 400) -> go.Figure:
    if not rows:
        return empty_figure("Tokens per second: no race yet. Press Race to time the baseline and the methods.", height)
    top = max((r["tokens_per_second"] or 0 for r in rows), default=0) or 1.0
    fig = go.Figure(go.Bar(
        x=[_short(r["label"]) for r in rows], y=[r["tokens_per_second"] or 0 for r in rows], cliponaxis=False,
        marker_color=[OKABE_ITO["blue"] if r["method"] == "baseline" else OKABE_ITO["bluish green"] for r in rows],
        marker_pattern_shape=["" if r["method"] == "baseline" else "/" for r in rows],
        text=[_f(r["speedup"], "{:.2f}×") for r in rows], textposition="outside",
        customdata=[[_f(r["speedup"], "{:.2f}×"), _f(r["tau"])] for r in rows],
        hovertemplate="%{x}<br>%{y:.1f} tokens/s<br>speedup %{customdata[0]} over the baseline<br>"
                      "τ = %{customdata[1]}<extra></extra>"))
    title = "Tokens per second<br>(label: speedup over the baseline)"
    fig.update_layout(title=dict(text=title, font=dict(size=14)),
                      height=height, margin=dict(l=10, r=10, t=title_margin(title), b=10), plot_bgcolor="white",
                      yaxis=dict(title="tokens/s", gridcolor="#eee", range=[0, top * 1.2]))
    summary = "; ".join(f"{r['label']}: {_f(r['tokens_per_second'], '{:.1f}')} tokens/s"
                        + (f", {_f(r['speedup'], '{:.2f}×')} the baseline" if r["method"] != "baseline" else "")
                        for r in rows)
    return describe(fig, f"Tokens per second. {summary}.")


def legend_name(text: str) -> str:
    """A legend entry that fits a phone-width legend (one plotly never wraps): 'speculative · ' dropped, then broken
    into lines of at most 36 characters."""
    return wrap_title(text.replace("speculative · ", ""), 36)


def _short(label: str) -> str:
    """Bar labels: drop the 'speculative' prefix and break at the separators."""
    return label.removeprefix("speculative · ").replace(" · ", "<br>")


def leviathan_figure(rows: list[dict], height: int = 400) -> go.Figure:
    """S(α, γ, c) over α for each speculative method, with its measured (α̂, speedup) point."""
    spec = [r for r in rows if r["method"] == "speculative" and r["alpha"] is not None and r["c"] is not None]
    if not spec:
        return empty_figure("The expected-speedup curve appears once a speculative method has raced.", height)
    fig = go.Figure()
    palette = [OKABE_ITO["bluish green"], OKABE_ITO["orange"], OKABE_ITO["reddish purple"]]
    dashes = ["solid", "dash", "dot"]
    alphas = [i / 100 for i in range(0, 100)] + [0.995, 0.999]
    for i, row in enumerate(spec):
        color = palette[i % len(palette)]
        gamma, c = row["gamma"], row["c"]
        fig.add_trace(go.Scatter(
            x=alphas, y=[expected_speedup(a, gamma, c) for a in alphas], mode="lines",
            line=dict(color=color, dash=dashes[i % len(dashes)]),
            name=legend_name(f"S(α) {row['label']} (γ={gamma:.1f}, c={c:.2f})"),
            hovertemplate=f"α = %{{x:.2f}}<br>expected speedup S = %{{y:.2f}}× (γ = {gamma:.1f}, c = {c:.3f})"
                          "<extra></extra>"))
        predicted = expected_speedup(row["alpha"], gamma, c)
        fig.add_trace(go.Scatter(
            x=[row["alpha"]], y=[row["speedup"] or 0], mode="markers", marker=dict(size=13, color=color,
                                                                                      symbol="star"),
            name=legend_name(f"measured: {row['label']}"),
            hovertemplate=f"measured speedup %{{y:.2f}}× at α̂ = %{{x:.2f}} (α̂ from τ = {row['tau']:.2f})<br>"
                          f"the curve predicts {predicted:.2f}× there<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dot"))
    title = "Leviathan's expected speedup<br>S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1))"
    fig.update_layout(title=dict(text=title, font=dict(size=13)),
                      height=height, margin=dict(l=10, r=10, t=title_margin(title), b=10), plot_bgcolor="white",
                      legend=legend_below(),
                      xaxis=dict(title="α (per-token acceptance probability)", range=[0, 1], gridcolor="#eee"),
                      yaxis=dict(title="speedup over the baseline", gridcolor="#eee", rangemode="tozero"))
    points = "; ".join(f"{r['label']}: measured {_f(r['speedup'], '{:.2f}×')} at α̂ = {r['alpha']:.2f}, the curve "
                       f"predicts {expected_speedup(r['alpha'], r['gamma'], r['c']):.2f}×" for r in spec)
    return describe(fig, f"Expected speedup over α (Leviathan's formula) with the measured points. {points}.")


def cost_curves_figure(here: dict | None, elsewhere: dict | None, height: int = 360) -> go.Figure:
    """t(n)/t(1) against n: this machine's measured curve and, dashed, the one measured on an H100 elsewhere.
    Each curve is a dict from app/tabs/race/curves.py (label, model, dtype, ns, t, measured_at) or None."""
    curves = [(c, color, dash) for c, color, dash in ((here, OKABE_ITO["vermillion"], "solid"),
                                                      (elsewhere, OKABE_ITO["blue"], "dash")) if c]
    if not curves:
        return empty_figure("No verification-cost curve measured yet: a cost-aware race measures this machine's "
                            "(a few seconds).", height)
    fig = go.Figure()
    for curve, color, dash in curves:
        fig.add_trace(go.Scatter(
            x=curve["ns"], y=curve["t"], mode="lines+markers", line=dict(color=color, dash=dash),
            name=legend_name(curve["label"]),
            hovertemplate=f"{html.escape(curve['label'])}<br>verifying %{{x}} tokens in one forward costs %{{y:.2f}}× "
                          f"one token (t(n)/t(1), {curve['model']} {curve['dtype']}, measured "
                          f"{curve['measured_at']})<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dot"))
    models = sorted({f"{c['model']} {c['dtype']}" for c, _, _ in curves})
    title = wrap_title(f"Verification cost t(n)/t(1) · {' vs '.join(models)}")
    fig.update_layout(title=dict(text=title, font=dict(size=13)), height=height, plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=title_margin(title), b=10), legend=legend_below(),
                      showlegend=True,  # a lone curve names its machine too (plotly hides a one-trace legend)
                      xaxis=dict(title="n (tokens verified at once)", gridcolor="#eee", type="log",
                                 tickvals=[1, 2, 4, 8, 16, 32, 64]),
                      yaxis=dict(title="t(n)/t(1) (one-token steps)", gridcolor="#eee", rangemode="tozero"))
    said = "; ".join(f"{c['label']}: t(16)/t(1) = {t_at(c, 16):.2f}" for c, _, _ in curves if t_at(c, 16))
    return describe(fig, f"Verification cost against the number of tokens verified at once. {said}.")


def t_at(curve: dict | None, n: int) -> float | None:
    """The curve's t(n)/t(1) at a measured n (None where it was not measured)."""
    if not curve or n not in curve["ns"]:
        return None
    return curve["t"][curve["ns"].index(n)]


def cost_curves_note(here: dict | None, elsewhere: dict | None) -> str:
    """One sentence (Markdown) on why the same method wins on one machine and loses on another, from the curves."""
    h, e = t_at(here, 16), t_at(elsewhere, 16)
    h64, e64 = t_at(here, 64), t_at(elsewhere, 64)
    there = (f"on the H100 ({elsewhere['source']}, {elsewhere['measured_at']}, measured elsewhere) they cost "
             f"{e:.2f}" + (f" and {e64:.2f}" if e64 and h64 else "") if e else
             "no H100 t(n) curve is stored in bench/results, so only this machine's is drawn")
    if h is None:
        mine = "This machine's curve is not measured yet (a cost-aware race measures it)"
    else:
        mine = f"Here a 16-token verification costs {h:.2f} one-token steps" + \
            (f" and a 64-token one {h64:.2f}" if h64 else "")
    return (f"{mine}; {there}. A CPU with 2 cores does real arithmetic for every extra token, so t(n) climbs with n; "
            "a GPU's one-token step is bound by reading the weights, which 16 tokens share, so t(n) stays near 1 and "
            "long drafts and wide trees are almost free to verify there.")


RACE_CSS = """
.sl-race { border-collapse: collapse; font-size: 14px; }
.sl-race th, .sl-race td { border-bottom: 1px solid var(--border-color-primary, #ddd); padding: 4px 10px;
                           text-align: left; }
.sl-race th { cursor: help; }
@media (max-width: 860px) { .sl-race { font-size: 12.5px; } .sl-race th, .sl-race td { padding: 3px 5px; } }
.sl-race td.sl-rounding { cursor: help; text-decoration: underline dotted; }
.sl-race td.sl-mismatch { color: #b00020; font-weight: 600; cursor: help; }
"""
