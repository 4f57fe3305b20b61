"""Does a reduced draft vocabulary pay? Head forward time and held-out acceptance, full vocabulary vs top-N.

    python -m decoders.eagle measure --target smollm2-135m --head assets/eagle/smollm2-135m --vocab 0,16384,8192,4096

Times are the best of several repeats (robust to other processes sharing the CPU) of one head forward with a
200-token cache: 1 new position (a chain draft step) and 10 (one tree level), next to one target step.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from ..runtime.runner import CachedModel
from .data import Example, frequent_ids
from .head import EagleHead
from .train import acceptance_by_depth


def forward_ms(head: EagleHead, new: int, past: int = 200, repeats: int = 20) -> float:
    d = head.config.hidden_size
    device = head.fc.weight.device
    best = float("inf")
    with torch.inference_mode():
        cache = DynamicCache(config=head.config)
        head(torch.zeros(1, past, dtype=torch.long, device=device), torch.zeros(1, past, d, device=device), cache=cache)
        ids, feats = torch.zeros(1, new, dtype=torch.long, device=device), torch.randn(1, new, d, device=device)
        for _ in range(repeats):
            start = time.perf_counter()
            head(ids, feats, cache=cache)
            best = min(best, time.perf_counter() - start)
            cache.crop(-new)
    return best * 1e3


def target_step_ms(target: torch.nn.Module, new: int, past: int = 200, repeats: int = 10) -> float:
    model = CachedModel(target)
    model.forward(list(range(past)), last_only=True)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        model.forward(list(range(new)))
        best = min(best, time.perf_counter() - start)
        model.drop_last(new)
    return best * 1e3


def compare(head: EagleHead, target, heldout, train_examples: list[Example], sizes: list[int], depths: int) -> list[dict]:
    """One row per vocabulary size (0 = full): forward ms (1 and 10 positions), α by depth, recall."""
    rows = []
    for size in sizes:
        ids = frequent_ids(train_examples, size, target.config.vocab_size) if size else None
        head.set_draft_vocab(ids)
        quality = acceptance_by_depth(head, heldout, depths)
        rows.append({"vocab": size or target.config.vocab_size, "ms_1": forward_ms(head, 1), "ms_10": forward_ms(head, 10),
                     "alpha": quality["alpha"], "recall": quality["recall"]})
    return rows
