"""The Race tab's opening text: what the default race shows, quoting what was measured, never a promise.

The figures come from the last `python -m bench.race_defaults` run (bench/results/race-defaults.json): its date, the
machine and the load measured during it. A visitor's machine and its load may give other numbers, so the text says so;
the verdicts under a race then say what that race's own rounds did. Without the file it names no figure at all.
"""
from __future__ import annotations

import json
from pathlib import Path

from app.shared.paths import ROOT
from app.tabs.race.load import is_busy, load_words

RESULTS = ROOT / "bench" / "results" / "race-defaults.json"
DEFAULT_CASE = "repeat-list"  # the candidate prompt the Race opens on (bench/race_defaults.py CANDIDATES)

LEAD = ("Run the **same prompt** through the baseline and up to three methods, one after another, each after a short "
        "warm-up and with recording off. The number format, draft model and sampling settings come from the "
        "Generate tab. ")
COPY = ("The default race is a copy task on SmolLM2: prompt lookup drafts by copying from the prompt, so it can win "
        "here with output identical to the baseline's. ")
TAIL = ("Free text gives it nothing to copy: try the Generate tab's prompt to see that. The sentences under a race "
        "say what its own rounds did and how busy the machine was while it ran.")


def race_intro(path: Path = RESULTS) -> str:
    """The tab's Markdown intro, with the last measured default race (or none) in the middle."""
    return LEAD + COPY + measured_sentence(path) + TAIL


def measured_sentence(path: Path = RESULTS) -> str:
    """'Measured on 2026-11-27 on x86_64, 2 threads (quiet: …): A 2.52×, B 2.55× the baseline; yours may differ. '"""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data["prompts"][DEFAULT_CASE]
    except (OSError, ValueError, KeyError, TypeError):
        return "Whether it wins on your machine depends on the machine and its load. "
    raced = [row for row in rows if row.get("speedup") is not None and "baseline" not in row.get("label", "")]
    if not raced:
        return "Whether it wins on your machine depends on the machine and its load. "
    figures = ", ".join(f"{_short(row['label'])} {row['speedup']:.2f}×" for row in raced)
    when = f" on {str(data['date'])[:10]}" if data.get("date") else ""
    machine = f" on {data['machine']}" if data.get("machine") else ""
    note = _load_note(rows) or (f" ({data['load_note']})" if data.get("load_note") else "")
    return (f"The last measured default race{when}{machine}{note}: {figures} the baseline "
            f"(median of 3 timed runs; bench/results/race-defaults.md). Yours may differ. ")


def _load_note(rows: list[dict]) -> str:
    """' (a quiet machine: …)' or ' (a busy machine: …)' from the load recorded with the rows ('' if none was)."""
    loads = [row.get("load") for row in rows if row.get("load")]
    if not loads:
        return ""
    worst = max(loads, key=lambda load: load.get("others_cores") or 0.0)
    state = "a busy machine" if any(is_busy(load) for load in loads) else "a quiet machine"
    return f" ({state}; at most {load_words(worst)})"


def _short(label: str) -> str:
    return label.removeprefix("speculative · ")
