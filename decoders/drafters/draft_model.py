"""A separate, smaller draft model with its own KV cache (Leviathan et al.; Chen et al.)."""
from __future__ import annotations

from torch import nn

from ..runtime.runner import CachedModel
from .base import Drafter, Proposal, ReadsPrompt, draft_chain


class DraftModelDrafter(ReadsPrompt, Drafter):  # ReadsPrompt: its start (the prompt, in prefill chunks)
    name = "draft-model"

    def __init__(self, model: nn.Module):
        self.runner = CachedModel(model)

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        unseen = ids[self.runner.length:]  # committed tokens the draft has not consumed: the pending one, maybe more
        return draft_chain(lambda tokens: self.runner.forward(tokens, last_only=True)[-1], unseen, limit, rule,
                           warp, generator, record, tensors=True)  # the chain's drafts stay on the device

    def observe(self, n_before: int, n_accepted: int, path=None, features=None) -> None:
        # The cache holds ids[:n_before] plus the drafts it was fed; keep only drafts that were accepted.
        fed_drafts = self.runner.length - n_before
        self.runner.drop_last(fed_drafts - min(fed_drafts, n_accepted))

    def kv_peak_bytes(self) -> int:
        return self.runner.peak_bytes

    def use_kv(self, plan) -> None:
        self.runner = CachedModel(self.runner.model, plan)  # its drafts stay within the run's budget: no extra room

    def runtime(self) -> dict:
        return {"draft": self.runner.runtime()}

    def close(self) -> None:
        self.runner.release()
