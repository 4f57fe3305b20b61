"""Which of the target's hidden states a drafter reads, picked off the verification forward that made them all."""
from __future__ import annotations

import torch


def pick_features(hidden_states: tuple[torch.Tensor, ...], which: bool | tuple[int, ...]) -> torch.Tensor:
    """The features a drafter reads off one forward's hidden states (transformers' output_hidden_states: entry k is
    the state entering layer k, the last one is after the final norm). which=True: that top feature (EAGLE-1/2);
    (k1, k2, k3): those entries concatenated, low to high (EAGLE-3). (B, n, H) or (B, n, 3H)"""
    if which is True:
        return hidden_states[-1]  # (B, n, H)
    return torch.cat([hidden_states[k] for k in which], dim=-1)  # (B, n, len(which) * H)
