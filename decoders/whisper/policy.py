"""The settings Whisper's search policies take (light: no whisper import), shared by the decoder table
(registry.py), the options that validate them (options.py) and the policies themselves (search.py)."""
from __future__ import annotations

from enum import StrEnum


class Aggregate(StrEnum):
    """How Min Lookahead folds a rollout's log-probabilities into one number."""

    MIN = "min"    # the worst upcoming step
    MEAN = "mean"
    SUM = "sum"
