"""The types of the claims table, shared by the measures (bench/claim_measures.py), the table (bench/claims.py), its
words (bench/claims_view.py) and the app's Claims tab: a paper's Figure, a Measurement read from a results file, a
Claim with its Headline designation, and a ClaimRow on the page, with the one ratio wording every row uses
("0.58× the paper's 2–2.5×"). It imports nothing of bench/, so every one of them can import it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

Results = dict[str, dict]  # file stem -> parsed results JSON


@dataclass(frozen=True)
class Figure:
    """A paper's number as something to divide by: `value` is the number, or the bottom of a range."""
    value: float
    text: str  # as the paper states it, e.g. "2–2.5×", "−2.26 WER points"
    is_range: bool = False


@dataclass(frozen=True)
class Measurement:
    """One measured counterpart to a claim, read from one results file."""
    key: str  # unique within its file: what a claim's headline designation names
    ours: float | None  # the number set against the paper's figure
    short: str  # that number in words, e.g. "1.69× over our greedy baseline"
    detail: str  # what else the run measured (kinds, τ, α …)
    setting: str  # models and number format
    hardware: str
    command: str  # relative to the repository root
    source: str  # the results file, e.g. "pair.json"
    figure: Figure | None = None  # replaces the claim's figure (Leviathan: S at this run's α, γ, c)
    note: str = ""  # why there is no ratio, when there is none


RATIO_WORDING = re.compile(r"^-?\d+\.\d\d× the paper's \S.*$")  # tests hold every ratio cell to this


def ratio(ours: float | None, figure: Figure) -> tuple[str, str]:
    """(cell text, hover text): ours ÷ the paper's figure (the bottom of a range), in the one wording."""
    if ours is None or not figure.value:
        return "–", "no number to compare"
    value = ours / figure.value
    what = f"the bottom of the paper's {figure.text}" if figure.is_range else f"the paper's {figure.text}"
    return (f"{value:.2f}× the paper's {figure.text}",
            f"ours {ours:.2f} ÷ {figure.value:g} ({what}) = {value:.2f}; 1.00 would equal the paper's figure")


@dataclass(frozen=True)
class Headline:
    stem: str  # the results file: bench/results/<stem>.json
    key: str  # the measurement inside it (Measurement.key)
    why: str  # why this run speaks for SpecLab


@dataclass(frozen=True)
class Claim:
    method: str
    paper: str  # authors, venue, where the number is printed
    setting: str  # the paper's hardware, models, task
    claim: str  # the number as the paper states it
    figure: Figure | None  # what our number is divided by (None: each measurement brings its own, as S does)
    why: str  # one sentence: why our headline differs
    why_more: str  # the longer explanation, shown with the history
    measure: Callable[[Results], list[Measurement]]
    headline: Headline | None = None
    coming: str = ""  # non-empty when the method has not landed in SpecLab: what is missing


@dataclass(frozen=True)
class ClaimRow:
    """One claim on the page: its headline measurement (or why there is none) and the rest, its history."""
    claim: Claim
    headline: Measurement | None
    history: list[Measurement]
    note: str  # "" when the headline was found, else "not measured: …", "coming: …" or "headline run missing: …"

    def ratio(self, measurement: Measurement | None = None) -> tuple[str, str]:
        m = measurement or self.headline
        figure = m.figure or self.claim.figure if m else None
        return ratio(m.ours, figure) if m and figure else ("–", m.note if m and m.note else "no figure to compare")
