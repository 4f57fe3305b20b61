"""The output text with token provenance, as a gr.HighlightedText value, and the marks that go with it (pure).

A character can span several tokens (an emoji or a CJK character in a byte-level BPE): the trace gives the tokens
that end inside it the text "" and the token that completes it the whole character (decoders/recorder.py), and
an empty span is invisible and cannot be clicked. So the display merges such tokens into one span with the token
that completes the character; the span takes that token's provenance and round, and `round_of_span` maps a click
on any span back through the same grouping.
"""
from __future__ import annotations

import html

from decoders.trace import Trace

from app.shared.theme import PROVENANCE_COLORS, PROVENANCE_HELP, PROVENANCE_NAMES, PROVENANCE_UNDERLINES, ROUND_MARK, \
    rgba, token_key

TEXT_SCOPE = "#sl-text"  # the HighlightedText's elem_id (app/tabs/generate/layout.py)
SMALL_MODELS_NOTE = ("These small models are chosen to run on a laptop CPU, and their answers can be wrong: "
                     "watch how the decoder reaches an answer, not whether the answer is right.")


def display_groups(trace: Trace) -> list[list[int]]:
    """Token indices per displayed span: every token that shows no text joins the next one that does; trailing
    ones (a character the run never finished) join the span before them."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i, token in enumerate(trace.tokens):
        pending.append(i)
        if token.text:
            groups.append(pending)
            pending = []
    if pending:
        if groups:
            groups[-1].extend(pending)
        else:
            groups.append(pending)
    return groups


def provenance_spans(trace: Trace) -> list[tuple[str, str]]:
    """One (text, provenance) span per displayed group; the texts concatenate to trace.output_text.

    Spans are never merged across characters, so a span is one token wherever a token shows text of its own.
    """
    spans = []
    for group in display_groups(trace):
        last = trace.tokens[group[-1]]
        spans.append(("".join(trace.tokens[i].text for i in group), last.provenance))
    return spans


def round_of_span(trace: Trace, index: int | None) -> int | None:
    """The round that committed the token shown by span `index` (None when out of range)."""
    groups = display_groups(trace)
    if index is None or not 0 <= int(index) < len(groups):
        return None
    return trace.tokens[groups[int(index)][-1]].round


def shown_pieces(text: str) -> int:
    """How many token elements Gradio draws for one span: one per non-empty line piece (newlines become line
    breaks, and a span with no visible piece draws none)."""
    return sum(1 for piece in text.split("\n") if piece)


def round_mark_css(trace: Trace, index: int | None) -> str:
    """A CSS rule that outlines the shown round's tokens in the output text (empty when no round is shown).

    Gradio gives its token elements no index, so the rule counts them with :nth-child(k of .token-container).
    """
    if index is None:
        return ""
    selectors, element = [], 0
    for group, (text, _) in zip(display_groups(trace), provenance_spans(trace)):
        pieces = shown_pieces(text)
        if any(trace.tokens[i].round == index for i in group):
            selectors += [f"{TEXT_SCOPE} .token-container:nth-child({element + k + 1} of .token-container) > .token"
                          for k in range(pieces)]
        element += pieces
    return f"{', '.join(selectors)} {{ {ROUND_MARK} }}" if selectors else ""


def legend_html(trace: Trace | None = None, index: int | None = None) -> str:
    """The key to the output text (colour and underline per provenance, the outline of the shown round), the
    note about small models, and the CSS that outlines round `index`'s tokens."""
    items = "".join(
        f'<span class="sl-key" title="{html.escape(PROVENANCE_HELP[name], quote=True)}"><span class="sl-swatch" '
        f'style="background:{rgba(color, 0.5)};text-decoration:underline {PROVENANCE_UNDERLINES[name]} #222 2px;'
        f'text-underline-offset:3px">tok</span> {PROVENANCE_NAMES[name]}</span>'
        for name, color in PROVENANCE_COLORS.items())
    mark = round_mark_css(trace, index) if trace is not None else ""
    shown = (f'<span class="sl-key"><span class="sl-swatch sl-swatch-round">tok</span> round {index + 1}\'s '
             f'tokens</span>') if mark else ""
    style = f"<style>{mark}</style>" if mark else ""
    return (f'<div class="sl-legend" aria-label="Key to the output text">Tokens: {items}{shown}</div>'
            f'<p class="sl-note">In the tree\'s labels: {html.escape(token_key())}.</p>'
            f'<p class="sl-note">{html.escape(SMALL_MODELS_NOTE)}</p>{style}')
