"""Prophet drafting (decoders/selfdraft/heads.py Prophet): a small decoder whose first input is the target's last
hidden state at the last accepted position, projected; it then drafts γ tokens on its own, with a cache that
lives for one round. The hidden state comes free from the verification forward (wants_target_hidden)."""
from __future__ import annotations

import torch
from transformers import DynamicCache

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
        cache = DynamicCache(config=self.model.config)
        first = [True]

        def step(tokens: list[int] | torch.Tensor) -> torch.Tensor:  # a list, or a greedy chain's (1,) draft
            ids = torch.as_tensor(tokens, device=self.feature.device)  # (n,)
            if first[0]:  # [W [f_t ; E(x_{t+1})]]: the pending token joins the feature in one input
                embedded = self.model.first_input(self.feature[None], ids[:1])  # (1, d)
                first[0] = False
            else:
                embedded = self.model.embed(ids)  # (n, d)
            past, n = cache.get_seq_length(), embedded.shape[0]
            positions = torch.arange(past, past + n, device=embedded.device)[None]  # (1, n)
            logits = self.model(embedded[None], positions, step_mask(n, past, embedded.dtype, embedded.device),
                                cache)[0, -1]  # (N|V,)
            return self._full(logits)

        try:
            return draft_chain(step, [ids[-1]], limit, rule, warp, generator, record, tensors=True)
        finally:
            from ..runtime import cache as kv

            self.peak_bytes = max(self.peak_bytes, kv.bytes_held(cache))

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        ids = self.model.vocab.vocab_ids
        if ids is None:
            return logits
        full = torch.full((self.vocab,), -torch.inf, dtype=logits.dtype, device=logits.device)  # (V,)
        full[ids] = logits
        return full

    def summary(self) -> dict:
        from ..runtime.runner import decoder_layers

        return {"self_draft": {"kind": "prophet", "block_layers": len(self.model.layers),
                               "target_layers": len(decoder_layers(self.model.target))}}

    def kv_peak_bytes(self) -> int:
        return self.peak_bytes

    def close(self) -> None:
        self.feature = None
