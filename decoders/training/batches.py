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


class BatchStream:
    """make_batches epoch after epoch, with a position that a checkpoint saves: the RNG and the batches left.

    The examples may grow between sessions (more replies written): indices stay valid, new examples join at the
    next epoch."""

    def __init__(self, examples: Sequence[HasIds], batch_tokens: int, seed: int):
        self.examples, self.batch_tokens = examples, batch_tokens
        self.rng = random.Random(seed)
        self.groups: list[list[int]] = []
        self.epochs = 0

    def next(self) -> list[int]:
        if not self.groups:
            self.groups.extend(make_batches(self.examples, self.batch_tokens, self.rng))
            self.epochs += 1
        return self.groups.pop()

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "groups": [list(g) for g in self.groups], "epochs": self.epochs,
                "examples": len(self.examples)}

    def load_state_dict(self, state: dict) -> None:
        if state["examples"] > len(self.examples):
            raise ValueError(f"the checkpoint's data held {state['examples']} sequences, this run has only "
                             f"{len(self.examples)}: resume with the same (or more) data")
        self.rng.setstate(state["rng"])
        self.groups = [list(g) for g in state["groups"]]
        self.epochs = state["epochs"]


class RandomPicks:
    """Uniform draws (with replacement) from a fixed list, e.g. the prophet's chain starts; its RNG is saved."""

    def __init__(self, items: Sequence, seed: int):
        self.items, self.rng = items, random.Random(seed)

    def draw(self, count: int) -> list:
        return [self.items[self.rng.randrange(len(self.items))] for _ in range(count)]

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
