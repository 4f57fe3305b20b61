"""The chain drafters over a batch: the same proposals, row by row, with the model forwards shared.

Row r's proposal is exactly what the single-row drafter (decoders/drafters) proposes for row r alone: the same
tokens, the same rule checks, and the same draws from row r's own generator in the same order. Only the forwards are
batched: `draft_chains` runs `decoders.drafters.base.draft_chain` for every row in lockstep, one batched draft
forward per position, each row stopping on its own (its limit, its rule).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..drafters import Drafter, DraftStop, Proposal
from ..drafters.base import draft_position
from ..drafters.layer_skip import LayerSkipDrafter
from ..rules import DraftRule
from ..sampling import Warp
from ..tree import DraftTree
from .ragged import RaggedRunner

Step = Callable[[dict[int, list[int]]], dict[int, torch.Tensor]]  # row -> tokens fed  =>  row -> next logits (V,)


class BatchDrafter:
    """Interface. Rows are batch indices; `select_rows` follows the target's when rows leave."""

    name = "batch-drafter"

    def start(self, ids: list[list[int]]) -> None:
        """The prompts are known (each row's last id is its pending token)."""

    def propose(self, ids: list[list[int]], limits: list[int], rules: list[DraftRule | None], warp: Warp,
                generators: list[torch.Generator], record: bool) -> list[Proposal]:
        raise NotImplementedError

    def observe(self, row: int, n_before: int, n_accepted: int) -> None:
        """Row `row` had n_before ids when the round began and kept its first n_accepted drafts."""

    def select_rows(self, keep: list[int]) -> None:
        """Only the batch rows `keep` go on."""

    def realign(self) -> None:
        """Trim or compact the drafter's own cache after a round (a draft model's)."""

    def padding_counts(self) -> tuple[int, int]:
        return 0, 0

    def kv_peak_bytes(self) -> int:
        return 0

    def close(self) -> None:
        """Free caches."""


class PerRow(BatchDrafter):
    """Drafters without a model of their own (none, prompt lookup): one single-row drafter per row, unchanged."""

    def __init__(self, drafters: list[Drafter]):
        self.drafters = drafters
        self.name = drafters[0].name if drafters else "none"

    def start(self, ids):
        for drafter, row_ids in zip(self.drafters, ids):
            drafter.start(row_ids)

    def propose(self, ids, limits, rules, warp, generators, record):
        return [d.propose(i, limit, rule, warp, g, record)
                for d, i, limit, rule, g in zip(self.drafters, ids, limits, rules, generators)]

    def observe(self, row, n_before, n_accepted):
        self.drafters[row].observe(n_before, n_accepted)

    def select_rows(self, keep):
        self.drafters = [self.drafters[r] for r in keep]


class BatchDraftModel(BatchDrafter):
    """A draft model with one ragged cache for the batch (decoders/drafters/draft_model.py, batched)."""

    name = "draft-model"

    def __init__(self, model: nn.Module, batch: int):
        self.runner = RaggedRunner(model, batch)

    def start(self, ids):
        self.runner.forward([row[:-1] for row in ids], last_only=True)  # prefill; pending tokens are fed by propose

    def propose(self, ids, limits, rules, warp, generators, record):
        unseen = [row[self.runner.lengths[r]:] for r, row in enumerate(ids)]  # the pending token, maybe one more
        return draft_chains(self._step, unseen, limits, rules, warp, generators, record)

    def _step(self, feed: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        logits = self.runner.forward([feed.get(r, []) for r in range(self.runner.batch)], last_only=True)
        return {r: logits[r][-1] for r in feed}  # (V,) per fed row

    def observe(self, row, n_before, n_accepted):
        fed_drafts = self.runner.lengths[row] - n_before  # drafts the draft model consumed this round
        self.runner.drop_row_tail(row, fed_drafts - min(fed_drafts, n_accepted))

    def select_rows(self, keep):
        self.runner.select_rows(keep)

    def realign(self):
        self.runner.realign()

    def padding_counts(self):
        return self.runner.take_padding_counts()

    def kv_peak_bytes(self):
        return self.runner.peak_bytes

    def close(self):
        self.runner.release()


class BatchLayerSkip(BatchDrafter):
    """The target with layers skipped drafts in the target's own ragged cache, then takes its slots back."""

    name = "layer-skip"

    def __init__(self, target: RaggedRunner, single: LayerSkipDrafter):
        self.target = target
        self.skip, self.kept = single.skip, single.kept  # the single-row drafter validated the skip set

    def propose(self, ids, limits, rules, warp, generators, record):
        from ..runner import skipping_layers

        before = self.target.snapshot()
        try:
            with skipping_layers(self.target.model, self.skip):
                return draft_chains(self._step, [[row[-1]] for row in ids], limits, rules, warp, generators, record)
        finally:
            self.target.restore(before, self.kept)

    def _step(self, feed):
        logits = self.target.forward([feed.get(r, []) for r in range(self.target.batch)], last_only=True)
        return {r: logits[r][-1] for r in feed}  # (V,) per fed row


def draft_chains(step: Step, firsts: list[list[int]], limits: list[int], rules: list[DraftRule], warp: Warp,
                 generators: list[torch.Generator], record: bool) -> list[Proposal]:
    """decoders.drafters.base.draft_chain for every row at once: per row the same steps, checks and draws."""
    proposals = [Proposal(DraftTree.root_only(first[-1]), reason=DraftStop.LIMIT) for first in firsts]
    feed: dict[int, list[int]] = {}
    for r, limit in enumerate(limits):
        if limit <= 0:
            proposals[r].reason = DraftStop.BUDGET
        else:
            feed[r] = firsts[r]
    position = {r: 1 for r in feed}
    while feed:
        logits = step(feed)  # row -> (V,) for that row's next draft position
        feed = {}
        for r, row_logits in logits.items():
            token = draft_position(proposals[r], position[r], row_logits, rules[r], warp, generators[r], record)
            proposals[r].forwards += 1
            if token is not None and position[r] < limits[r]:
                feed[r] = [token]
                position[r] += 1
    return proposals



def build(name: str, ctx, batch: int) -> BatchDrafter:
    """The batched form of registry drafter `name` (registry.DRAFTERS[name].batched calls this). ctx.runner is the
    target's RaggedRunner."""
    from ..drafters import PromptLookupDrafter

    if name == "draft-model":
        return BatchDraftModel(ctx.draft.model, batch)
    if name == "layer-skip":
        from ..registry import drafter as spec  # the registry's builder validates the skip set

        return BatchLayerSkip(ctx.runner, spec("layer-skip").build(ctx))
    if name == "prompt-lookup":
        return PerRow([PromptLookupDrafter(ctx.options.ngram, tuple(ctx.target.eos_token_ids)) for _ in range(batch)])
    raise ValueError(f"no batched form of drafter {name!r}")
