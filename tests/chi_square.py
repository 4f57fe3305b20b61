"""Pearson's chi-square goodness-of-fit p-value, shared by the distribution tests (no scipy needed)."""
from __future__ import annotations

import torch


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(X² >= observed statistic) for counts against exact probabilities of the same shape.

    Cells expected below 5 are pooled into one, so the chi-square approximation holds; degrees of freedom are the
    remaining cells minus one.
    """
    observed, expected = counts.flatten().double().cpu(), probs.flatten().double().cpu() * float(counts.sum())
    small = expected < 5
    if small.any():  # pool sparse cells so the chi-square approximation holds
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    statistic = (((observed - expected) ** 2)[keep] / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), statistic / 2))
