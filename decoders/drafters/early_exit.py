"""Early-exit self-speculation with a trained exit block (Kangaroo / LayerSkip style, decoders/selfdraft).

Draft: the target's own first k layers, on the target's own KV cache, then a trained block (its own one-layer
cache) and the target's final norm + LM head. Verification (`score`) does not run layers 0..k-1 again: the draft
already wrote their keys/values for every drafted token and kept their outputs h_k, so it runs layers k..L-1 over
those h_k only. Between draft and verification the lower layers' cache slots hold the round's tokens and the upper
ones do not; after `score` every slot holds the same N+1 entries and the loop's keep_path trims them all alike.
With a fixed KV plan both halves run at fixed shapes (issue 46): a chain's draft steps after the round's first
(decoders/selfdraft/exit_step.py) and the verification (decoders/selfdraft/upper.py), each replayed as a captured
graph with graphs on.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..runtime import cache as kv
from ..runtime.runner import CachedModel
from ..selfdraft.heads import ExitBlock
from ..runtime.buffers import BufferCache
from ..selfdraft.exit_step import FixedExitStep
from ..selfdraft.upper import UpperForward
from ..selfdraft.stem import causal_mask, step_mask, stem_layers, target_rotary, upper_layers, run_layers
from .base import Drafter, Proposal, draft_chain


BLOCK_ROUND_ROOM = 64  # a fixed block buffer's room past the run's committed tokens: a round's fed drafts


class EarlyExitDrafter(Drafter):
    name = "early-exit"

    def __init__(self, target: CachedModel, block: ExitBlock):
        self.target, self.block = target, block
        self.k = block.exit_layer
        model = target.model
        self.stem, self.upper = stem_layers(model, self.k), upper_layers(model, self.k)
        self.rotary = target_rotary(model)
        self.upper_forward = UpperForward(model, self.k, self.rotary)  # score's layers k..L-1 at a fixed shape
        self.vocab = model.config.vocab_size
        self.plan = None  # the run's KV plan (use_kv): with a fixed one the block's cache is a buffer too
        self.block_cache = self._new_block_cache()
        self.fixed_step: FixedExitStep | None = None  # a chain's later draft steps at one shape (fixed plans)
        self.rows: list[torch.Tensor] = []  # h_k (d,) of this round's nodes whose stem has run, in order
        self.unfed: list[torch.Tensor] = []  # h_k of committed tokens the block has not read yet
        self.fed = 0  # how many of this round's nodes the block has read
        self.peak_bytes = 0
        self.reused_layer_tokens = 0  # token x layer passes verification did not repeat (the saving, counted)

    # ------------------------------------------------------------------ the shared stem

    @torch.inference_mode()
    def _stem(self, tokens: list[int] | torch.Tensor) -> torch.Tensor:
        """Layers 0..k-1 over `tokens` (a list, or a device tensor: a chain's last draft, never read) after the
        lower cache; appends to those slots. -> h_k (n, d)"""
        past = self.target.cache.layers[0].get_seq_length()
        ids = torch.as_tensor(tokens, device=self.target.device)[None]  # (1, n)
        hidden = self.target.model.get_input_embeddings()(ids)  # (1, n, d)
        positions = torch.arange(past, past + len(tokens), device=ids.device)[None]  # (1, n)
        mask = step_mask(len(tokens), past, hidden.dtype, ids.device)  # (1, 1, n, past + n)
        return run_layers(self.stem, hidden, positions, mask, self.rotary, self.target.cache)[0]  # (n, d)

    @torch.inference_mode()
    def _block(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """The exit block over h_k rows after its own cache. -> logits over the target vocabulary (V,) of the last."""
        hidden = torch.stack(rows)[None]  # (1, n, d)
        past = self.block_cache.get_seq_length()
        positions = torch.arange(past, past + len(rows), device=hidden.device)[None]  # (1, n)
        logits = self.block(hidden, positions, step_mask(len(rows), past, hidden.dtype, hidden.device),
                            self.block_cache)[0, -1]  # (N|V,)
        return self._full_vocab(logits)

    def _full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The block's logits (N|V,) over the target's vocabulary (V,): -inf outside a reduced draft vocabulary."""
        self.peak_bytes = max(self.peak_bytes, kv.bytes_held(self.block_cache))
        if self.block.vocab.vocab_ids is None:
            return logits
        full = torch.full((self.vocab,), -torch.inf, dtype=logits.dtype, device=logits.device)  # (V,)
        full[self.block.vocab.vocab_ids] = logits
        return full

    def _new_block_cache(self):
        """The block's own cache: a DynamicCache, or with a fixed plan a buffer with room for the run and a round."""
        if self.plan is not None and self.plan.fixed:
            return BufferCache(self.block.config, self.plan.capacity(BLOCK_ROUND_ROOM))
        return DynamicCache(config=self.block.config)

    def use_kv(self, plan) -> None:
        """A fixed plan: the block's cache becomes a buffer and a chain's later steps run at one shape
        (FixedExitStep, replayed as a graph with graphs on)."""
        self.plan = plan
        self.block_cache = self._new_block_cache()
        self.fixed_step = FixedExitStep(self, plan.graphs) if plan.fixed else None

    # ------------------------------------------------------------------ the drafter interface

    def start(self, ids: list[int], features=None) -> None:
        """The prefill filled the target's cache; the block needs h_k of the prompt: layers 0..k-1 once more,
        without cache (k/L of a prefill), since the loop's prefill does not hand hidden states over."""
        self.unfed = self.prompt_stem(ids)  # read by the first propose together with the pending token

    @torch.inference_mode()
    def prompt_stem(self, ids: list[int]) -> list[torch.Tensor]:
        """h_k (d,) of every prompt token but the pending last one, by an uncached pass of layers 0..k-1."""
        if len(ids) < 2:
            return []
        ids_t = torch.tensor([ids[:-1]], device=self.target.device)  # (1, n)
        hidden = self.target.model.get_input_embeddings()(ids_t)  # (1, n, d)
        n = ids_t.shape[1]
        positions = torch.arange(n, device=ids_t.device)[None]
        return list(run_layers(self.stem, hidden, positions, causal_mask(n, 0, hidden.dtype, ids_t.device),
                               self.rotary)[0])  # n rows (d,)

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        self.rows, self.fed = [], 0

        def step(tokens: list[int] | torch.Tensor) -> torch.Tensor:
            if self._at_one_shape(tokens):  # a draft after the round's first: one token, never read
                logits, h = self.fixed_step(tokens)  # (N|V,), (d,)
                self.rows.append(h)
                self.fed += 1
                return self._full_vocab(logits)
            h = self._stem(tokens)  # (n, d)
            self.rows.extend(h)
            self.fed += len(tokens)
            rows, self.unfed = self.unfed + list(h), []
            return self._block(rows)  # (V,)

        proposal = draft_chain(step, [ids[-1]], limit, rule, warp, generator, record, tensors=True)
        self._drop_unsent(len(self.rows) - proposal.tree.size)
        return proposal

    def _at_one_shape(self, tokens) -> bool:
        return (self.fixed_step is not None and isinstance(tokens, torch.Tensor) and not self.unfed
                and self.fixed_step.usable())

    def _drop_unsent(self, extra: int) -> None:
        """A device chain runs its steps past the rule's stop (decoders/drafters/base._chain_on_device) and drops
        those positions when read: their stem entries, block entries and rows go too, so the stem's cache holds
        this round's sent nodes alone, as score and the loop's keep_path expect."""
        if extra <= 0:
            return
        self.target.drop_last(extra, layers=list(range(self.k)))
        kv.drop_last(self.block_cache, extra)
        del self.rows[-extra:]
        self.fed -= extra

    @torch.inference_mode()
    def score(self, target: CachedModel, tree, hidden: bool):
        """Verification over layers k..L-1 only; the stem outputs of drafted tokens are reused."""
        missing = tree.tokens[len(self.rows):]  # the last draft when drafting stopped at the limit (never fed)
        if missing:
            self.rows.extend(self._stem(missing))
        rows = torch.stack(self.rows)  # (N+1, d)
        if target.fixed is not None:  # a fixed KV plan: one fixed-shape forward, replayed as a graph with graphs on
            logits, features = self.upper_forward(target.fixed, rows)  # (N+1, V), (N+1, d)
        else:
            logits, features = self._upper_eager(target, rows)
        target._note_peak()
        self.reused_layer_tokens += (rows.shape[0] - len(missing)) * self.k
        return logits, (features if hidden else None)

    def _upper_eager(self, target: CachedModel, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers k..L-1 over rows (N+1, d) after a growing cache (DynamicCache, or buffers read as views)."""
        h = rows[None]  # (1, N+1, d)
        past = target.cache.layers[-1].get_seq_length()  # the upper layers' length: the committed context
        positions = torch.arange(past, past + h.shape[1], device=h.device)[None]  # (1, N+1)
        mask = step_mask(h.shape[1], past, h.dtype, h.device)  # (1, 1, N+1, past + N+1)
        top = run_layers(self.upper, h, positions, mask, self.rotary, target.cache)  # (1, N+1, d)
        features = target.model.get_decoder().norm(top)[0]  # (N+1, d)
        return target.model.get_output_embeddings()(features), features  # (N+1, V), (N+1, d)

    def observe(self, n_before: int, n_accepted: int, path=None, features=None) -> None:
        """Keep the block's entries of the root and accepted drafts; rows it has not read wait for the next round."""
        keep = 1 + n_accepted
        if self.fed > keep:
            kv.drop_last(self.block_cache, self.fed - keep)
        else:
            self.unfed += list(self.rows[self.fed:keep])
        self.rows, self.fed = [], 0

    def runtime(self) -> dict:
        """With a fixed plan: the block's buffer and how the draft steps at one shape ran (graph or eager)."""
        if self.fixed_step is None:
            return {}
        return {"draft": self.fixed_step.step.summary(self.block_cache.capacity)}

    def summary(self) -> dict:
        total = self.k + len(self.upper)
        return {"self_draft": {"kind": "early-exit", "exit_layer": self.k, "target_layers": total, "block_layers": 1,
                               "reused_layer_tokens": self.reused_layer_tokens}}

    def kv_peak_bytes(self) -> int:
        return self.peak_bytes

    def close(self) -> None:
        self.block_cache = self._new_block_cache()
        if self.fixed_step is not None:
            self.fixed_step = FixedExitStep(self, self.plan.graphs)  # its graph read the old block buffer
        self.rows, self.unfed = [], []
