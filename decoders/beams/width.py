"""DSBD's dynamic width (docs/algorithms.md §6.3, from the official code's get_num_acc_prob / get_expect_cnt_by_thres).

The number A of target beams that W i.i.d. draft draws can produce by recursive rejection sampling has a
distribution D[W] that P and Q determine: after i failures in a row the next draw succeeds with probability
α_i = Σ min(R_i, Q) (R_i the residual after i rejections), and every success resets the residual to P. The width
of a layer is the largest k with P(A ≥ k) ≥ thres, so the W drafts suffice with probability at least thres.
"""
from __future__ import annotations

import torch

from ..verify import residual


def acceptance_count_distribution(p: torch.Tensor, q: torch.Tensor, width: int) -> list[float]:
    """D[k] = P(exactly k of `width` draws are accepted), k = 0..width. p: (N,) target joint; q: (N,) draft joint,
    restricted to the valid parents and not renormalised (its missing mass is draws that always fail)."""
    r = p  # (N,)
    alpha: list[float] = []
    for _ in range(width):
        alpha.append(float(torch.minimum(r, q).sum()))
        r = residual(r, q)  # (N,) the target mass left after one more rejection
    first = [0.0] * (width + 1)  # first[i]: the first success comes at draw i (from a fresh residual P)
    none = [1.0] * (width + 1)  # none[m]: m draws in a row all fail
    for i in range(1, width + 1):
        first[i] = none[i - 1] * alpha[i - 1]
        none[i] = none[i - 1] * (1.0 - alpha[i - 1])
    table = [[0.0] * (width + 1) for _ in range(width + 1)]  # table[m][k] = P(k successes in m draws)
    table[0][0] = 1.0
    for m in range(1, width + 1):
        table[m][0] = none[m]
        for k in range(1, m + 1):
            table[m][k] = sum(first[i] * table[m - i][k - 1] for i in range(1, m + 1))
    return table[width]


def choose_width(distribution: list[float], thres: float, min_width: int) -> int:
    """The largest k with P(A ≥ k) ≥ thres (at least min_width): more beams only when the drafts likely suffice."""
    chosen, tail = 0, 0.0
    for k in range(len(distribution) - 1, -1, -1):
        tail += distribution[k]
        if tail >= thres - 1e-9:  # float slack: P = Q gives a tail of 0.9999999 for a certain event
            chosen = k
            break
    return max(chosen, min_width)
