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

from ..runtime import buffers, kernels
from ..runtime.buffers import KVPlan
from ..drafters import Drafter, DraftStop, Proposal
from ..drafters.base import draft_position
from ..drafters.early_exit import EarlyExitDrafter
from ..drafters.layer_skip import LayerSkipDrafter
from ..drafters.prophet import ProphetDrafter
from ..selfdraft.stem import run_layers
from ..rules import DraftRule
from ..sampling import Warp
from ..tree import DraftTree
from .ragged import RaggedRunner

Step = Callable[[dict[int, list[int]]], dict[int, torch.Tensor]]  # row -> tokens fed  =>  row -> next logits (V,)


class BatchDrafter:
    """Interface. Rows are batch indices; `select_rows` follows the target's when rows leave."""

    name = "batch-drafter"
    wants_target_hidden = False  # True: the prefill hands start() the target's last hidden state of every row

    def start(self, ids: list[list[int]], features: list[torch.Tensor] | None = None) -> None:
        """The prompts are known (each row's last id is its pending token). features[r]: (1, H) the target's last
        hidden state at row r's last prompt position (empty for a one-token prompt), only if wants_target_hidden."""

    def propose(self, ids: list[list[int]], limits: list[int], rules: list[DraftRule | None], warp: Warp,
                generators: list[torch.Generator], record: bool) -> list[Proposal]:
        raise NotImplementedError

    def score(self, target: RaggedRunner, proposals: list[Proposal]) -> list[torch.Tensor]:
        """Every row's chain through the target in one batched forward -> per row logits (N_r+1, V). A drafter
        that already ran part of the target (early exit) or wants its hidden states (prophet) does it its own way."""
        return target.forward([p.tree.tokens for p in proposals])

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

    def summary(self) -> dict:
        """What every row's trace totals get (decoders.drafters.base.Drafter.summary, for the whole batch)."""
        return {}

    def close(self) -> None:
        """Free caches."""


class PerRow(BatchDrafter):
    """One single-row drafter per row, unchanged: drafters without a model of their own (none, prompt lookup), and
    an int8 draft model (`draft_model_form` says why). `plan`: a row's prompt ids -> the KV plan its single run's
    drafter gets (decoders/api.py stream), for drafters with a cache of their own."""

    def __init__(self, drafters: list[Drafter], plan: Callable[[list[int]], KVPlan] | None = None):
        self.drafters = drafters
        self.every = list(drafters)  # rows that left too: their caches' peaks count in the batch's
        self.plan = plan
        self.name = drafters[0].name if drafters else "none"

    def start(self, ids, features=None):
        for drafter, row_ids in zip(self.drafters, ids):
            if self.plan is not None:
                drafter.use_kv(self.plan(row_ids))
            drafter.start(row_ids)

    def propose(self, ids, limits, rules, warp, generators, record):
        return [d.propose(i, limit, rule, warp, g, record)
                for d, i, limit, rule, g in zip(self.drafters, ids, limits, rules, generators)]

    def observe(self, row, n_before, n_accepted):
        self.drafters[row].observe(n_before, n_accepted)

    def select_rows(self, keep):
        for r, drafter in enumerate(self.drafters):
            if r not in keep:
                drafter.close()  # a finished row's cache goes now
        self.drafters = [self.drafters[r] for r in keep]

    def kv_peak_bytes(self):
        return sum(drafter.kv_peak_bytes() for drafter in self.every)

    def close(self):
        for drafter in self.drafters:
            drafter.close()


def draft_model_form(ctx, batch: int, single: Callable[[], Drafter]) -> BatchDrafter:
    """A draft model's batched form: one ragged cache and one batched forward per draft position -- except for an
    int8 draft, which drafts each row alone, exactly as its single run does (its own cache, its prefill chunks).

    Why: a batched forward sums in other orders than a one-row forward (attention over the ragged cache's padded
    width with its mask, matmuls blocked by the batch's row count), so a row's float activations differ from its
    single run's in the last bits. A float32 draft passes that on as it is (its q moves by ~1e-7). An int8 draft
    quantizes each activation onto 126 levels (decoders/kernels.py Int8Linear), and an activation that lies at a
    rounding boundary moves a whole level for a last-bit difference: the row's q then differs by far more than
    rounding, and a sampled row draws other drafts than alone (issue 47: the Qwen pair, T 0.8, a row differed at its
    3rd token). Only an identical computation gives the identical q, so the int8 draft forwards are not shared."""
    if kernels.kernels_of(ctx.draft.model) != kernels.INT8:
        return BatchDraftModel(ctx.draft.model, batch)
    options = ctx.options
    kind = buffers.resolve(options.kv_cache, ctx.runner.device, options.cuda_graphs)
    return PerRow([single() for _ in range(batch)], lambda ids: buffers.KVPlan(
        kind, committed=len(ids) + options.max_new_tokens, graphs=options.cuda_graphs))


class BatchDraftModel(BatchDrafter):
    """A draft model with one ragged cache for the batch (decoders/drafters/draft_model.py, batched)."""

    name = "draft-model"

    def __init__(self, model: nn.Module, batch: int):
        self.runner = RaggedRunner(model, batch)

    def start(self, ids, features=None):
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
        from ..runtime.runner import skipping_layers

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


class BatchEarlyExit(BatchDrafter):
    """Early exit (decoders/drafters/early_exit.py) over a batch, keeping its reuse of layers 0..k-1.

    Drafting runs the stem (target layers 0..k-1) on the target's own ragged cache, so during a round those k layers
    hold extra columns that layers k..L-1 do not: one block per stem pass, each row's slots real or padding, tracked
    in `stem_valid`. The exit block reads the stem's h_k in a ragged cache of its own (`blocks`). Verification
    (`score`) runs layers k..L-1 only, over the h_k the draft kept, as one block laid out like any target forward;
    then the stem layers' round columns are gathered into that same layout, so every layer holds the same slots
    again and the loop's per-row cuts and the realignment treat all layers alike. The gather copies the k stem
    layers' entries of this round's tokens only.
    """

    name = "early-exit"

    def __init__(self, target: RaggedRunner, single: EarlyExitDrafter):
        self.target, self.single = target, single  # the registry's single-row drafter: its stem, block and checks
        self.k, self.block = single.k, single.block
        self.blocks = RaggedRunner(single.block, target.batch)  # the exit block's own cache, ragged like the target's
        self.unfed: list[list[torch.Tensor]] = [[] for _ in range(target.batch)]  # h_k rows the block has not read
        self.rows: list[list[torch.Tensor]] = []  # per row: h_k (d,) of this round's nodes whose stem has run
        self.fed: list[int] = []  # per row: this round's nodes the block has read
        self.stem_valid = torch.zeros(target.batch, 0, dtype=torch.bool)  # (B, s): the stem layers' round columns
        self.stem_lengths: list[int] = []  # per row: real tokens in the stem layers
        self.reused_layer_tokens = 0

    def start(self, ids, features=None):
        self.unfed = [self.single.prompt_stem(row) for row in ids]  # the single-row drafter's uncached stem pass

    def propose(self, ids, limits, rules, warp, generators, record):
        batch = self.target.batch
        self.rows, self.fed = [[] for _ in range(batch)], [0] * batch
        self.stem_valid = torch.zeros(batch, 0, dtype=torch.bool)
        self.stem_lengths = list(self.target.lengths)
        return draft_chains(self._step, [[row[-1]] for row in ids], limits, rules, warp, generators, record)

    def _step(self, feed):
        h = self._stem(feed)  # row -> (n_r, d)
        reads = []
        for r in range(self.target.batch):
            if r in feed:
                self.rows[r].extend(h[r])
                self.fed[r] += len(feed[r])
                reads.append(torch.stack(self.unfed[r] + list(h[r])))  # (u + n_r, d)
                self.unfed[r] = []
            else:
                reads.append(h[r][:0] if r in h else torch.empty(0))
        logits = self.blocks.forward_vectors(reads, last_only=True)  # per fed row (1, N|V)
        return {r: self._full(logits[r][-1]) for r in feed}  # (V,) per fed row

    @torch.inference_mode()
    def _stem(self, feed: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Layers 0..k-1 over each row's new tokens, appended to those layers only. -> row -> h_k (n_r, d)"""
        target = self.target
        counts = [len(feed.get(r, [])) for r in range(target.batch)]
        past = torch.cat([target.valid, self.stem_valid], dim=1)  # (B, W + s)
        block_valid, positions, mask = target.layout(counts, self.stem_lengths, past)
        n = block_valid.shape[1]
        ids = torch.zeros(target.batch, n, dtype=torch.long)  # (B, n); pads: token 0, never attended to
        for r, tokens in feed.items():
            ids[r, n - len(tokens):] = torch.tensor(tokens)
        hidden = target.model.get_input_embeddings()(ids.to(target.device))  # (B, n, d)
        h = run_layers(self.single.stem, hidden, positions, mask, self.single.rotary, target.cache)  # (B, n, d)
        self.stem_valid = torch.cat([self.stem_valid, block_valid], dim=1)
        target.padding_added += int((~block_valid).sum())
        for r, k in enumerate(counts):
            self.stem_lengths[r] += k
        return {r: h[r, n - len(tokens):] for r, tokens in feed.items()}

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """Reduced draft vocabulary -> the target's (V,), -inf outside it (as the single-row drafter does)."""
        ids = self.block.vocab.vocab_ids
        if ids is None:
            return logits
        full = torch.full((self.single.vocab,), -torch.inf, dtype=logits.dtype, device=logits.device)  # (V,)
        full[ids] = logits
        return full

    @torch.inference_mode()
    def score(self, target, proposals):
        """Layers k..L-1 only, over the h_k of every row's N_r+1 nodes; layers 0..k-1 ran while drafting."""
        trees = [p.tree for p in proposals]
        missing = {r: tree.tokens[len(self.rows[r]):] for r, tree in enumerate(trees) if tree.size > len(self.rows[r])}
        if missing:  # the last draft of a chain stopped at its limit (never fed), or a row that drafted nothing
            for r, h in self._stem(missing).items():
                self.rows[r].extend(h)
        counts = [tree.size for tree in trees]
        width = target.width  # the upper layers' slots: the committed context
        block_valid, positions, mask = target.layout(counts)
        n = block_valid.shape[1]
        h = torch.zeros(target.batch, n, self.rows[0][0].shape[-1], dtype=target.dtype, device=target.device)
        for r, rows in enumerate(self.rows):
            h[r, n - len(rows):] = torch.stack(rows)  # (N_r+1, d), left-padded like every block
        top = run_layers(self.single.upper, h, positions, mask, self.single.rotary, target.cache)  # (B, n, d)
        logits = target.model.get_output_embeddings()(target.model.get_decoder().norm(top))  # (B, n, V)
        self._relay_stem(width, n)
        target.padding_removed += int((~self.stem_valid).sum())  # the round's stem columns are gone
        target.commit(block_valid, counts)
        self.reused_layer_tokens += self.k * sum(c - len(missing.get(r, [])) for r, c in enumerate(counts))
        return [logits[r, n - c:] for r, c in enumerate(counts)]  # (N_r+1, V) per row

    def _relay_stem(self, width: int, n: int) -> None:
        """Layers 0..k-1: each row's round slots (its N_r+1 nodes, in order) into the last N_r+1 of n new columns,
        the verification block's layout; the round's own columns go."""
        index = torch.zeros(self.target.batch, n, dtype=torch.long)  # (B, n): source column; pads: any column
        for r in range(self.target.batch):
            real = width + self.stem_valid[r].nonzero().flatten()  # (N_r+1,) ascending: token order
            index[r, n - len(real):] = real
        for layer in self.target.cache.layers[: self.k]:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)  # (B, H, W + s, D)
                gather = index.to(tensor.device)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                setattr(layer, name, torch.cat([tensor[:, :, :width], tensor.gather(2, gather)], dim=2))  # (B,H,W+n,D)

    def observe(self, row, n_before, n_accepted):
        """The block keeps its entries of the root and accepted drafts; rows it has not read wait for next round."""
        keep = 1 + n_accepted
        if self.fed[row] > keep:
            self.blocks.drop_row_tail(row, self.fed[row] - keep)
        else:
            self.unfed[row] += self.rows[row][self.fed[row]:keep]

    def select_rows(self, keep):
        self.blocks.select_rows(keep)
        self.unfed = [self.unfed[r] for r in keep]

    def realign(self):
        self.blocks.realign()

    def padding_counts(self):
        return self.blocks.take_padding_counts()

    def kv_peak_bytes(self):
        return self.blocks.peak_bytes

    def summary(self):
        summary = self.single.summary()
        summary["self_draft"]["reused_layer_tokens"] = self.reused_layer_tokens  # the whole batch's
        return summary

    def close(self):
        self.blocks.release()
        self.unfed, self.rows = [], []


class BatchProphet(BatchDrafter):
    """Prophet (decoders/drafters/prophet.py) over a batch: every row's first input is the target's last hidden
    state at its last kept node, from the verification forward (hidden=True); the prophet's cache lives for one
    round, ragged like the target's (rows stop drafting at different depths)."""

    name = "prophet"
    wants_target_hidden = True

    def __init__(self, single: ProphetDrafter, batch: int):
        self.model, self.vocab = single.model, single.vocab
        self.single = single
        self.features: list[torch.Tensor | None] = [None] * batch  # per row (d,): f_t before its pending token
        self.scored: list[torch.Tensor] = []  # per row (N_r+1, H): this round's verification hidden states
        self.peak_bytes = 0

    def start(self, ids, features=None):
        self.features = [f[-1] if f is not None and len(f) and len(row) > 1 else None
                         for f, row in zip(features, ids)]

    @torch.inference_mode()
    def propose(self, ids, limits, rules, warp, generators, record):
        runner = RaggedRunner(self.model, len(ids))  # this round's cache
        ready = [r for r, f in enumerate(self.features) if f is not None]
        cut = [limit if self.features[r] is not None else 0 for r, limit in enumerate(limits)]
        first = set(ready)

        def step(feed):
            reads = []
            for r in range(runner.batch):
                if r not in feed:
                    reads.append(torch.empty(0))
                elif r in first:  # [W [f_t ; E(x_{t+1})]]: the pending token joins the feature in one input
                    token = torch.tensor(feed[r][:1], device=runner.device)
                    reads.append(self.model.first_input(self.features[r][None], token))  # (1, d)
                    first.discard(r)
                else:
                    reads.append(self.model.embed(torch.tensor(feed[r], device=runner.device)))  # (n, d)
            logits = runner.forward_vectors(reads, last_only=True)  # per fed row (1, N|V)
            return {r: self.single._full(logits[r][-1]) for r in feed}

        try:
            proposals = draft_chains(step, [[row[-1]] for row in ids], cut, rules, warp, generators, record)
        finally:
            self.peak_bytes = max(self.peak_bytes, runner.peak_bytes)
            runner.release()
        for r, proposal in enumerate(proposals):
            if self.features[r] is None:  # a one-token prompt: one plain target step first (as alone)
                proposal.reason = DraftStop.NONE
        return proposals

    def score(self, target, proposals):
        logits, self.scored = target.forward([p.tree.tokens for p in proposals], hidden=True)
        return logits

    def observe(self, row, n_before, n_accepted):
        self.features[row] = self.scored[row][n_accepted]  # (H,): the last kept node, which chose the next token

    def select_rows(self, keep):
        self.features = [self.features[r] for r in keep]

    def kv_peak_bytes(self):
        return self.peak_bytes

    def summary(self):
        return self.single.summary()

    def close(self):
        self.features, self.scored = [], []


# The batched form of each registry drafter (registry.DRAFTERS[name].batched names one; decoders/batch/run.py
# builds it). `single()` builds the registry's one-row drafter for the same context (ctx.runner is the target's
# RaggedRunner): its builder validates a skip set, finds and checks trained weights, and the batched form reuses it.
FORMS: dict[str, Callable[..., BatchDrafter]] = {
    "per-row": lambda ctx, batch, single: PerRow([single() for _ in range(batch)]),
    "draft-model": draft_model_form,
    "layer-skip": lambda ctx, batch, single: BatchLayerSkip(ctx.runner, single()),
    "early-exit": lambda ctx, batch, single: BatchEarlyExit(ctx.runner, single()),
    "prophet": lambda ctx, batch, single: BatchProphet(single(), batch),
}
