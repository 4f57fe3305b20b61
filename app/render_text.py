"""The output text with token provenance, as a gr.HighlightedText value (pure)."""
from __future__ import annotations

from decoders.trace import Trace


def provenance_spans(trace: Trace) -> list[tuple[str, str]]:
    """One (text, provenance) span per output token; the texts concatenate to trace.output_text.

    Spans are never merged, so span i is token i and a click on it maps straight to its round.
    """
    return [(token.text, token.provenance) for token in trace.tokens]


def round_of_span(trace: Trace, index: int | None) -> int | None:
    """The round that committed the token at span `index` (None when out of range)."""
    if index is None or not 0 <= int(index) < len(trace.tokens):
        return None
    return trace.tokens[int(index)].round
