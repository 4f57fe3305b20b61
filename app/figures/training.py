"""How well SpecLab's trained drafters guess, depth by depth, next to a published EAGLE head (pure: files in, figure out).

The measured side is what `python -m decoders.training compare` wrote to bench/results/drafter-<kind>-<target>-heldout.json:
greedy acceptance α(k) at draft depth k given depths 1..k-1 accepted, teacher-forced on the target's own replies to
prompts no drafter trained on. The row drawn is the one now shipped (the candidate where the comparison shipped it,
else the drafter it was compared against). The published side is EAGLE's Table 2 (Li et al., ICML 2024): n-α of
Vicuna 7B's head on MT-bench, T = 0, a chain draft (arXiv:2401.15077).

Why acceptance sets the speed: a chain of D drafts accepts E = α1 + α1·α2 + ... + α1···αD of them a round on average,
so a round yields τ = 1 + E tokens for one target forward (plus the drafts' cost): τ is in each legend entry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from app.shared.paths import ROOT
from app.shared.theme import OKABE_ITO, describe, hover_lines, legend_below, title_margin, wrap_title

RESULTS = ROOT / "bench" / "results"
DRAFTERS = {"eagle": ("EAGLE head", OKABE_ITO["bluish green"]), "early-exit": ("early exit", OKABE_ITO["orange"]),
            "prophet": ("prophet", OKABE_ITO["reddish purple"])}
# EAGLE (ICML 2024) Table 2: Vicuna 7B, MT-bench, T = 0, chain draft; n-α for n = 0..4 self-predicted features.
PAPER_ALPHA = (0.79, 0.74, 0.72, 0.73, 0.67)
PAPER_LABEL = "EAGLE paper, Vicuna 7B head"


@dataclass(frozen=True)
class Measured:
    kind: str
    alpha: tuple[float, ...]  # α(1..D) on the held-out replies
    sequences: int
    tokens: int
    source: str  # the results file it came from

    @property
    def tau(self) -> float:
        return tau(self.alpha)


def tau(alpha) -> float:
    """Tokens per target forward of a chain with these acceptance rates: 1 + Σ_k Π_{j<=k} α_j."""
    total, reach = 1.0, 1.0
    for a in alpha:
        reach *= a
        total += reach
    return total


def shipped_scores(target: str = "smollm2-135m", folder: Path = RESULTS) -> list[Measured]:
    """The shipped drafters' held-out α by depth, one per kind whose comparison file exists."""
    out = []
    for kind in DRAFTERS:
        path = folder / f"drafter-{kind}-{target}-heldout.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        row = data["scores"]["candidate" if data.get("wins") else "shipped"]
        out.append(Measured(kind, tuple(row["alpha"]), data["heldout_sequences"], data["heldout_tokens"],
                            path.name))
    return out


def acceptance_figure(measured: list[Measured], height: int = 360) -> go.Figure:
    """α(k) against draft depth k: each shipped drafter (solid) and the published head (dashed)."""
    fig = go.Figure()
    depths = list(range(1, len(PAPER_ALPHA) + 1))
    for m in measured:
        name, color = DRAFTERS[m.kind]
        hover = [hover_lines([f"<b>{name}</b>, depth {k}", f"α = {a:.3f}: the share of drafts at depth {k} "
                              f"the target accepted, given depths 1..{k - 1} were", f"{m.sequences} held-out replies "
                              f"({m.tokens:,} tokens), {m.source}", f"chain τ {m.tau:.2f}: tokens per target forward of a "
                              f"{len(m.alpha)}-draft chain, 1 + α1 + α1·α2 + ..."]) for k, a in enumerate(m.alpha, 1)]
        fig.add_trace(go.Scatter(x=list(range(1, len(m.alpha) + 1)), y=list(m.alpha), mode="lines+markers",
                                 name=f"{name} (chain τ {m.tau:.2f})", line=dict(color=color, width=3),
                                 hovertext=hover, hoverinfo="text"))
    paper_hover = [hover_lines([f"<b>{PAPER_LABEL}</b>, depth {k}", f"{k - 1}-α = {a:.2f} (EAGLE, Table 2: "
                                "MT-bench, T = 0, chain draft)"]) for k, a in enumerate(PAPER_ALPHA, 1)]
    fig.add_trace(go.Scatter(x=depths, y=list(PAPER_ALPHA), mode="lines+markers",
                             name=f"{PAPER_LABEL} (chain τ {tau(PAPER_ALPHA):.2f})",
                             line=dict(color=OKABE_ITO["black"], dash="dash", width=2),
                             marker=dict(symbol="diamond-open"), hovertext=paper_hover, hoverinfo="text"))
    best = max(measured, key=lambda m: m.alpha[0], default=None)
    title = ("Held-out acceptance by draft depth · " + (
        f"best α(1) here {best.alpha[0]:.2f} ({DRAFTERS[best.kind][0]}); paper {PAPER_ALPHA[0]:.2f}"
        if best else "no comparison recorded yet (python -m decoders.training compare)"))
    wrapped = wrap_title(title)
    fig.update_layout(title=dict(text=wrapped, font=dict(size=14)), height=height, plot_bgcolor="white",
                      margin=dict(t=title_margin(wrapped), l=50, r=10, b=10), legend=legend_below(),
                      xaxis=dict(title="draft depth k", dtick=1, gridcolor="#eee"),
                      yaxis=dict(title="α(k)", range=[0, 1], gridcolor="#eee"))
    summary = "; ".join(f"{DRAFTERS[m.kind][0]} α(1) {m.alpha[0]:.2f}, τ {m.tau:.2f}" for m in measured)
    return describe(fig, f"Acceptance by draft depth. {summary}; the EAGLE paper's head α(1) {PAPER_ALPHA[0]:.2f}, "
                         f"τ {tau(PAPER_ALPHA):.2f}.")
