"""Beam state shared by the beam methods: per-beam KV rows that follow their parents, and the finished pool.

The model for the interface is openai-whisper's BeamSearchDecoder + rearrange_kv_cache: the cache holds one batch
row per live beam; after every selection the rows are gathered by parent index (`reorder`). Convention, as in the
chain loop: a beam's last token is *pending* (chosen, not yet in the cache), so every row caches len(seq) - 1
tokens and the next forward feeds the pending tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..runtime import cache as kv


class BeamRows:
    """A model plus a DynamicCache with one row per live beam (all rows the same length)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = kv.new_cache(model)

    @property
    def length(self) -> int:
        return kv.length(self.cache)

    @property
    def rows(self) -> int:
        layer = self.cache.layers[0]
        return int(layer.keys.shape[0]) if getattr(layer, "is_initialized", False) else 0

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int]) -> None:
        """Cache the prompt except its last token (the first pending token), in one row."""
        if len(prompt_ids) > 1:
            ids = torch.tensor([prompt_ids[:-1]], device=self.device)  # (1, n-1)
            self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def step(self, pending: list[int]) -> torch.Tensor:
        """Feed one pending token per row; returns float32 logits (rows, V) for the next token of every beam."""
        start = self.length
        ids = torch.tensor(pending, device=self.device)[:, None]  # (R, 1)
        positions = torch.full_like(ids, start)  # (R, 1): every row has the same length
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()  # (R, V)

    @torch.inference_mode()
    def reorder(self, parents: list[int] | torch.Tensor) -> None:
        """Row j of the new cache = row parents[j] of the old one (whisper's rearrange_kv_cache)."""
        if self.length == 0:  # nothing cached (a one-token prompt): the rows come into being at the next forward
            self.cache = kv.new_cache(self.model)  # (a cropped draft forest may have left R empty rows)
            return
        index = torch.as_tensor(parents, dtype=torch.long, device=self.device)  # (R',)
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.keys = layer.keys.index_select(0, index)  # (R', H, S, D)
                layer.values = layer.values.index_select(0, index)  # (R', H, S, D)

    def kv_bytes(self) -> int:
        """Bytes held by the cache's key/value tensors (what beams cost in memory)."""
        return kv.bytes_held(self.cache)

    def crop(self, length: int) -> None:
        """Drop every entry after the first `length` (a draft forest, once its layers are drawn)."""
        kv.drop_last(self.cache, self.length - length)

    def release(self) -> None:
        self.cache = kv.new_cache(self.model)


@dataclass
class Candidate:
    """A finished hypothesis: its generated tokens (EOS included if it ended there), its ranking score (the
    method's own, see decoders/beams/trace.py) and the target's cumulative log-probability of its tokens."""

    tokens: list[int]
    score: float
    logp: float | None = None


@dataclass
class FinishedPool:
    """The best `capacity` distinct finished hypotheses, highest score first.

    Distinct: the same token sequence can finish twice (beam sampling draws with replacement, so two beams may be
    one sequence); it is kept once, with its higher score, so `full` means `capacity` different hypotheses."""

    capacity: int
    items: list[Candidate] = field(default_factory=list)

    def add(self, tokens: list[int], score: float, logp: float | None = None) -> None:
        tokens = list(tokens)
        same = next((c for c in self.items if c.tokens == tokens), None)
        if same is not None:
            if score <= same.score:
                return
            self.items.remove(same)
        self.items.append(Candidate(tokens, float(score), None if logp is None else float(logp)))
        self.items.sort(key=lambda c: -c.score)  # stable: among equal scores the earlier one stays first
        del self.items[self.capacity:]

    @property
    def full(self) -> bool:
        return len(self.items) >= self.capacity

    def worst(self) -> float:
        return self.items[-1].score if self.items else float("-inf")

    def best(self) -> Candidate | None:
        return self.items[0] if self.items else None


class PeakMeter:
    """The most KV bytes the given caches held at once, read right after each forward (where the peaks are: a
    forward appends its block, and only commits, reorders and crops shrink it again)."""

    def __init__(self, *rows: BeamRows):
        self.rows = rows
        self.peak = 0

    def note(self) -> None:
        self.peak = max(self.peak, sum(r.kv_bytes() for r in self.rows))


@torch.inference_mode()
def extend(rows: BeamRows, tokens: list[list[int]]) -> None:
    """Append the same number of tokens to every row (a causal forward; the logits are not needed)."""
    start = rows.length
    ids = torch.tensor(tokens, device=rows.device)  # (R, n)
    positions = torch.arange(start, start + ids.shape[1], device=rows.device)[None].expand_as(ids)  # (R, n)
    rows.model(input_ids=ids, position_ids=positions, past_key_values=rows.cache, use_cache=True, logits_to_keep=1)
