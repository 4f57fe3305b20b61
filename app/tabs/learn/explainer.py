"""The rejection-sampling explainer: one drafted position, p against q, and why sampling stays exact.

Every draw here goes through the REAL verification core (decoders.verify.verify_sampling) on a one-position draft
tree, so the histogram the page shows is the core's output, not a copy of its math. A chain position is a root
with one drafted child; "siblings" is a root with k children drawn i.i.d. from q, which the core walks by
recursive rejection (each rejection shrinks the residual before the next sibling is tried).

Paper names: p = target distribution, q = draft distribution, r = the residual norm(max(p − q, 0)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import plotly.graph_objects as go
import torch

from decoders.sampling import sample, seeded_generator
from decoders.tree import DraftTree
from decoders.verify import Verdict, residual, verify_sampling

from app.shared.words import counted
from app.shared.theme import OKABE_ITO, STATUS_COLORS, describe, legend_below, title_margin, wrap_title

# A toy next-token vocabulary after "The cat sat on the": small enough to read every bar on a phone.
WORDS = ("mat", "sofa", "floor", "bed", "roof", "chair", "rug", "box")
TRACE_NAMES = ("p (target)", "q (draft)", "min(p, q): accepted mass", "residual norm(max(p − q, 0))")


@dataclass(frozen=True)
class Position:
    """One drafted position: the target p and the draft q over WORDS. Both (V,) and summing to 1."""

    p: torch.Tensor  # (V,)
    q: torch.Tensor  # (V,)

    @property
    def acceptance(self) -> float:
        """α for this position: Σ min(p, q), the chance the draft's token survives (Leviathan et al. 2023, §3)."""
        return float(torch.minimum(self.p, self.q).sum())


def toy_position(mismatch: float = 0.5) -> Position:
    """p fixed; q slides from p itself (mismatch 0) to a draft that prefers other words (mismatch 1).

    A knob the class can turn: α = Σ min(p, q) falls as the draft disagrees more, and the residual grows.
    """
    if not 0.0 <= mismatch <= 1.0:
        raise ValueError(f"mismatch must be between 0 and 1 (got {mismatch}); 0 = draft equals target")
    p = torch.tensor([0.40, 0.22, 0.14, 0.09, 0.06, 0.04, 0.03, 0.02], dtype=torch.float64)  # (V,)
    other = torch.tensor([0.10, 0.05, 0.30, 0.05, 0.02, 0.28, 0.15, 0.05], dtype=torch.float64)  # (V,)
    q = (1 - mismatch) * p + mismatch * other  # (V,)
    return Position(p, q / q.sum())


def draft_tree(q: torch.Tensor, n_siblings: int, generator: torch.Generator) -> DraftTree:
    """A root with n_siblings children drawn i.i.d. from q (n_siblings = 1 is one chain position)."""
    tree = DraftTree.root_only(pending=0)
    for _ in range(n_siblings):
        token = sample(q, generator)
        tree.add(0, token, float(q[token]))
    tree.q_dists[0] = q
    return tree


def one_step(position: Position, seed: int, n_siblings: int = 1) -> tuple[DraftTree, Verdict, int]:
    """Draft, then verify with the core; returns the tree, the core's verdict and the token the position emits."""
    generator = seeded_generator("cpu", seed)
    tree = draft_tree(position.q, n_siblings, generator)
    # row 0: p at the drafted position; rows 1..k: after an accepted sibling (their bonus draws are not shown)
    p_rows = position.p.expand(tree.size, -1)  # (k+1, V)
    verdict = verify_sampling(tree, p_rows, generator)
    token = tree.tokens[verdict.path[0]] if verdict.path else verdict.token
    return tree, verdict, token


def sample_counts(position: Position, n_draws: int = 1000, seed: int = 0, n_siblings: int = 1) -> torch.Tensor:
    """How often each word is emitted over n_draws independent draft-and-verify steps, all through the core. (V,)"""
    if n_draws < 1:
        raise ValueError(f"n_draws must be at least 1 (got {n_draws})")
    counts = torch.zeros(len(position.p), dtype=torch.long)  # (V,)
    for draw in range(n_draws):
        counts[one_step(position, seed * 1_000_003 + draw, n_siblings)[2]] += 1
    return counts


def step_story(position: Position, tree: DraftTree, verdict: Verdict) -> str:
    """Plain sentences for one step: what was drafted, the uniform draw against p/q, and what came out."""
    lines = []
    for check in verdict.checks:
        word = WORDS[tree.tokens[check.node]]
        verb = "accepted" if check.accepted else "rejected"
        lines.append(f"Draft proposed **{word}**; the core drew u = {check.uniform:.3f} against "
                     f"P(accept) = {check.accept_prob:.3f} (= min(1, r/q) with r the residual so far): {verb}.")
    if verdict.path:
        lines.append(f"Emitted **{WORDS[tree.tokens[verdict.path[0]]]}** (the draft's token).")
    else:
        lines.append(f"Every candidate was rejected, so the target drew **{WORDS[verdict.token]}** from the "
                     "residual norm(max(p − q, 0)): exactly the mass the draft under-proposed.")
    return "\n\n".join(lines)


def position_figure(position: Position, counts: torch.Tensor | None = None, height: int = 360) -> go.Figure:
    """Bars of p, q, min(p, q) and the residual over WORDS; with counts, the sampled frequencies as markers."""
    words = list(WORDS)
    accepted = torch.minimum(position.p, position.q)  # (V,)
    left = residual(position.p, position.q)  # (V,) the core's own residual
    fig = go.Figure()
    for name, values, color in zip(TRACE_NAMES, (position.p, position.q, accepted, left),
                                   (OKABE_ITO["blue"], OKABE_ITO["orange"], STATUS_COLORS["accepted"],
                                    STATUS_COLORS["resampled"])):
        fig.add_bar(name=name, x=words, y=values.tolist(), marker_color=color)
    if counts is not None:
        freq = (counts.double() / counts.sum()).tolist()
        fig.add_scatter(name=f"sampled ({counted(int(counts.sum()), 'draw')})", x=words, y=freq, mode="markers",
                        marker=dict(symbol="diamond", size=12, color="black"))
    title = wrap_title(f"α = Σ min(p, q) = {position.acceptance:.2f} · residual used on rejection")
    fig.update_layout(title=dict(text=title, font=dict(size=14)), barmode="group", height=height,
                      plot_bgcolor="white", yaxis=dict(title="probability", range=[0, 0.6]),
                      legend=legend_below(), margin=dict(l=50, r=10, t=title_margin(title), b=10))
    return describe(fig, f"Target p and draft q over {len(words)} words; accepted mass {position.acceptance:.2f}; "
                         "the residual is where a rejected draft's replacement is drawn from.")


def distance_summary(position: Position, counts: torch.Tensor) -> str:
    """Total-variation distance between the sampled frequencies and p: it shrinks like 1/sqrt(draws)."""
    freq = counts.double() / counts.sum()  # (V,)
    tv = 0.5 * float((freq - position.p).abs().sum())
    return (f"{counted(int(counts.sum()), 'draw')} through the verification core: total-variation distance to p = "
            f"{tv:.3f} "
            "(it shrinks like 1/√draws). The output follows p, not q: the draft only changes the speed.")


# --- handlers (the page calls these; tests call them too) ---
# Their PyTorch work runs inside the decode slot, like every model computation of the app: a server stopped while a
# thread is inside a PyTorch op outside it can abort (status 134; app/shared/decode_slot.py says why). While a
# longer run holds the slot, the story line says what it waits for.

def on_step(mismatch: float, seed: int, siblings: int) -> Iterator[tuple]:
    position = toy_position(float(mismatch))
    for waiting in _in_slot(lambda: one_step(position, int(seed), int(siblings))):
        if isinstance(waiting, str):
            yield _skip(), waiting
        else:
            tree, verdict, _ = waiting
            yield position_figure(position), step_story(position, tree, verdict)


def on_sample(mismatch: float, seed: int, siblings: int, n_draws: int = 1000) -> Iterator[tuple]:
    position = toy_position(float(mismatch))
    for waiting in _in_slot(lambda: sample_counts(position, int(n_draws), int(seed), int(siblings))):
        if isinstance(waiting, str):
            yield _skip(), waiting
        else:
            yield position_figure(position, waiting), distance_summary(position, waiting)


def _in_slot(work: Callable[[], object]) -> Iterator[object]:
    """Lines while another run holds the decode slot, then work()'s result, computed inside the slot."""
    from app.shared.decode_slot import DECODE_SLOT

    with DECODE_SLOT.queue(SLOT_NAME) as turn:
        yield from turn.lines()
        with DECODE_SLOT.hold(what=SLOT_NAME, turn=turn):
            result = work()
    yield result


def _skip():
    import gradio as gr

    return gr.skip()


SLOT_NAME = "the Learn tab's sampling explainer"


def build(with_glossary: bool = True) -> None:
    """The explainer's controls and figure, placed inside whatever tab or lesson calls it."""
    import gradio as gr

    from app.shared import glossary

    gr.Markdown("**Why sampling stays exact.** The draft proposes a word from q; the target accepts it with "
                "probability min(1, p/q); on rejection it draws from the residual norm(max(p − q, 0)). "
                "Accepted mass plus residual mass rebuild p exactly.")
    with gr.Row():
        mismatch = gr.Slider(0, 1, value=0.5, step=0.05, label="How much the draft disagrees (0 = q equals p)")
        siblings = gr.Slider(1, 4, value=1, step=1, label="Drafted siblings (1 = chain; more = tree, RRS)")
        seed = gr.Number(value=0, precision=0, label="Seed")
    with gr.Row():
        step_button = gr.Button("Draft and verify once", variant="primary")
        sample_button = gr.Button("Sample 1,000 times")
    figure = gr.Plot(position_figure(toy_position(0.5)), label="p, q, accepted mass, residual")
    story = gr.Markdown()
    step_button.click(on_step, [mismatch, seed, siblings], [figure, story])
    sample_button.click(on_sample, [mismatch, seed, siblings], [figure, story])
    if with_glossary:
        glossary.build()
