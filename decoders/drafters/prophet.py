"""Prophet drafting (decoders/selfdraft/heads.py Prophet): a small decoder whose first input is the target's last
hidden state at the last accepted position, projected; it then drafts γ tokens on its own, with a cache that
lives for one round. The hidden state comes free from the verification forward (wants_target_hidden)."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..runtime import cache as kv
from ..runtime.buffers import BufferCache
from ..runtime.steps import StepGraph, one_row_mask
from ..selfdraft.heads import Prophet
from ..selfdraft.stem import step_mask
from ..tree import DraftTree
from .base import Drafter, DraftStop, Proposal, draft_chain


class ProphetDrafter(Drafter):
    name = "prophet"
    wants_target_hidden = True

    def __init__(self, model: Prophet, vocab: int):
        self.model = model
        self.vocab = vocab
        self.feature: torch.Tensor | None = None  # (d,) the target's last hidden state before the pending token
        self.peak_bytes = 0
        self.fixed: FixedRound | None = None  # with a fixed KV plan (use_kv): the round cache as one buffer

    def use_kv(self, plan) -> None:
        """A fixed plan: each round drafts into one buffer of its own, one row a step at one shape (a graph replayed
        with graphs on); otherwise a DynamicCache a round, as before."""
        self.fixed = FixedRound(self.model, ROUND_SLOTS, plan.graphs) if plan.fixed else None

    def start(self, ids: list[int], features: torch.Tensor | None = None) -> None:
        if features is not None and len(features):
            self.feature = features[-1]  # (d,): the prompt's last position, which chose the pending token

    def observe(self, n_before: int, n_accepted: int, path=None, features=None) -> None:
        if features is not None:
            rows = [0] + list(path or [])[:n_accepted]
            self.feature = features[rows[-1]]  # (d,): the last kept node, which chose the next pending token

    @torch.inference_mode()
    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        if self.feature is None:  # a one-token prompt: no hidden state yet, so one plain target step first
            return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.NONE)
        fixed = self.fixed if self.fixed is not None and limit <= self.fixed.capacity else None
        cache = fixed.start_round() if fixed is not None else DynamicCache(config=self.model.config)
        first = [True]

        def step(tokens: list[int] | torch.Tensor) -> torch.Tensor:  # a list, or a device chain's (1,) draft
            ids = torch.as_tensor(tokens, device=self.feature.device)  # (n,)
            if first[0]:  # [W [f_t ; E(x_{t+1})]]: the pending token joins the feature in one input
                embedded = self.model.first_input(self.feature[None], ids[:1])  # (1, d)
                first[0] = False
            else:
                embedded = self.model.embed(ids)  # (n, d)
            if fixed is not None:
                return self._full(fixed(embedded))  # (V,): one row, fixed shape
            past, n = cache.get_seq_length(), embedded.shape[0]
            positions = torch.arange(past, past + n, device=embedded.device)[None]  # (1, n)
            logits = self.model(embedded[None], positions, step_mask(n, past, embedded.dtype, embedded.device),
                                cache)[0, -1]  # (N|V,)
            return self._full(logits)

        try:
            return draft_chain(step, [ids[-1]], limit, rule, warp, generator, record, tensors=True)
        finally:
            self.peak_bytes = max(self.peak_bytes, kv.bytes_held(cache))

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        ids = self.model.vocab.vocab_ids
        if ids is None:
            return logits
        full = torch.full((self.vocab,), -torch.inf, dtype=logits.dtype, device=logits.device)  # (V,)
        full[ids] = logits
        return full

    def runtime(self) -> dict:
        """The prophet's steps, for the trace: how many replayed a graph, with a fixed plan."""
        return {"draft": self.fixed.step.summary(self.fixed.capacity)} if self.fixed is not None else {}

    def summary(self) -> dict:
        from ..runtime.runner import decoder_layers

        return {"self_draft": {"kind": "prophet", "block_layers": len(self.model.layers),
                               "target_layers": len(decoder_layers(self.model.target))}}

    def kv_peak_bytes(self) -> int:
        return self.peak_bytes

    def close(self) -> None:
        self.feature = None


ROUND_SLOTS = 64  # a fixed round cache's slots: one per draft step (a round longer than this drafts on a DynamicCache)


class FixedRound:
    """The prophet's round cache as one buffer, and its draft step at one shape: a row (1, d) at the slot a device
    counter holds, attending over the whole buffer under a mask of the slots up to it (stale entries of earlier
    rounds sit past it, unseen). The counter moves on the device, so a step needs nothing from the host: replayed
    as a graph (decoders/runtime/steps.py) with graphs on, the same function eagerly otherwise."""

    def __init__(self, model: Prophet, capacity: int, graphs: bool):
        self.model, self.capacity = model, capacity
        self.cache = BufferCache(model.config, capacity)
        device = model.norm.weight.device
        self.slot = torch.zeros((), dtype=torch.long, device=device)  # () where the next step writes
        self.columns = torch.arange(capacity, device=device)  # (S,)
        self.step = StepGraph(self._step, graphs, state=(self.slot,))

    def start_round(self) -> BufferCache:
        self.slot.zero_()  # on the device: the round's first row goes to slot 0
        return self.cache

    def __call__(self, embedded: torch.Tensor) -> torch.Tensor:
        """embedded (1, d) the step's input row -> logits (N|V,) predicting the next draft."""
        return self.step(embedded)[0]

    def _step(self, embedded: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Tensor ops only (what a graph captures); writes at the slot and moves it on. -> ((N|V,), None)"""
        positions = self.slot.view(1, 1)  # (1, 1)
        mask = one_row_mask(self.slot, self.columns, embedded.dtype)  # (1, 1, 1, S): the round's rows up to this one
        with self.cache.fixed_write(self.slot.view(1), 0):  # lengths unused: the slot counter is the truth
            logits = self.model(embedded[None], positions, mask, self.cache)[0, -1]  # (N|V,)
        self.slot.add_(1)
        return logits, None
