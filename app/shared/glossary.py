"""The glossary: the symbols every panel uses, as plain sentences.

It is an accordion the reader taps open (not a hover tooltip), so it reads the same on a touch screen.
"""
from __future__ import annotations

# (symbol, name, meaning): one list, so a new term is one line.
TERMS = (
    ("τ", "tokens per round", "How many tokens one target forward pass yields on average: accepted drafts plus the "
     "one token the target adds. The baseline's τ is 1."),
    ("α", "acceptance rate", "The chance a drafted token survives verification; for one position it is "
     "Σ min(p, q) over the vocabulary (p = target, q = draft)."),
    ("c", "draft cost", "The time of one draft step divided by the time of one target forward. Cheap drafts "
     "(prompt lookup) have c near 0; a layer-skip draft costs a fraction of the target."),
    ("λ", "stop threshold", "The bound an adaptive rule (AdaEDL, max-confidence) compares against: drafting stops "
     "when the estimated acceptance falls below λ."),
    ("γ", "draft length", "How many tokens are drafted per round (the maximum, for an adaptive rule)."),
    ("t(n)", "verify time", "The target's forward time for n tokens at once on this hardware. Verification pays "
     "only if t(n) stays close to t(1): on a GPU it does, on a small CPU it grows with n."),
    ("S", "expected speed-up", "Leviathan et al.: S = (1 − α^(γ+1)) / ((1 − α)(γ·c + 1)), the wall-clock gain "
     "when t(n) = t(1). Measured speed-up falls short when t(n) grows."),
)


def markdown() -> str:
    """The glossary as a definition list in Markdown."""
    rows = [f"- **{symbol}** ({name}): {meaning}" for symbol, name, meaning in TERMS]
    return "\n".join(rows)


def build(open_: bool = False) -> None:
    """A tap-to-open glossary, placed inside the panel that calls it."""
    import gradio as gr

    with gr.Accordion("Glossary: τ, α, c, λ, γ, t(n)", open=open_, elem_classes=["sl-glossary"]):
        gr.Markdown(markdown())
