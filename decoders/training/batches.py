"""Length-bucketed training batches, shared by every learned drafter's training (anything with `.ids`)."""
from __future__ import annotations

import random
from typing import Protocol, Sequence


class HasIds(Protocol):
    ids: Sequence[int]


def make_batches(examples: Sequence[HasIds], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Groups of similar-length examples of about batch_tokens (padded) tokens each, in random order.

    Sorting by length first keeps padding small; the random tie-break and the final shuffle keep epochs different."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].ids), rng.random()))
    groups, current, longest = [], [], 0
    for i in order:
        n = len(examples[i].ids)
        if current and max(longest, n) * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        groups.append(current)
    rng.shuffle(groups)
    return groups


def length_sorted_chunks(examples: Sequence[HasIds], batch_tokens: int):
    """For recording a frozen target once: yield (chunk, ids, attention), chunks of about batch_tokens tokens in
    length order, right-padded. ids and attention are (B, n) long tensors; attention marks the real tokens."""
    import torch

    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    start = 0
    while start < len(order):
        take = max(1, batch_tokens // max(len(examples[order[start]].ids), 1))
        chunk = order[start : start + take]
        longest = max(len(examples[i].ids) for i in chunk)
        ids = torch.zeros(len(chunk), longest, dtype=torch.long)  # (B, n)
        attention = torch.zeros(len(chunk), longest, dtype=torch.long)  # (B, n)
        for row, i in enumerate(chunk):
            n = len(examples[i].ids)
            ids[row, :n], attention[row, :n] = torch.as_tensor(examples[i].ids), 1
        yield chunk, ids, attention
        start += len(chunk)
