"""Colours and labels shared by every view, so a status looks the same in the text, the tree and the legend."""
from __future__ import annotations

# Tree node statuses (decoders/trace.py NODE_STATUS) plus the target's own token (bonus / resampled / baseline).
STATUS_COLORS = {
    "root": "#4c4c4c",
    "accepted": "#2e9e44",
    "rejected": "#d62728",
    "not_reached": "#c7c7c7",
    "bonus": "#8e44ad",
    "resampled": "#e67e22",
    "baseline": "#3b7dd8",
}
STATUS_LABELS = {
    "root": "pending token (root)",
    "accepted": "draft accepted",
    "rejected": "draft rejected",
    "not_reached": "draft not reached",
    "bonus": "bonus (target, all drafts accepted)",
    "resampled": "resampled (target, after a rejection)",
    "baseline": "target step (no draft)",
}
# HighlightedText labels = token provenance (decoders/trace.py PROVENANCE).
PROVENANCE_COLORS = {k: STATUS_COLORS[k] for k in ("accepted", "resampled", "bonus", "baseline")}
PROVENANCE_HELP = {
    "accepted": "a draft token the target accepted (free: no target step of its own)",
    "resampled": "the target's replacement after it rejected a draft",
    "bonus": "the target's extra token after it accepted every draft of the round",
    "baseline": "a plain target step: the baseline, or a round without any draft",
}


def visible_token(text: str, limit: int = 16) -> str:
    """Token text with whitespace made visible, shortened for node labels."""
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣")
    if not shown:
        shown = "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
