"""The batch generation loop: decoders/loop.py's round, for B rows at once, with one batched target forward.

Per row it does exactly what run_rounds does for that row alone (same limit, same proposal, same verification
with the row's own generator, same commit and EOS cut, same rule update); only the forwards are shared. After
the round, finished rows leave and the caches are realigned (decoders/batch/__init__.py says how).
"""
from __future__ import annotations

from typing import Iterator

import torch

from ..clock import DecodeClock
from ..loop import _cut_at_eos
from ..readout import read_round
from ..recorder import TraceBuilder
from ..rules import DraftRule
from ..sampling import Warp
from ..verify import verify
from .drafters import BatchDrafter
from .ragged import RaggedRunner
from .trace import BatchRound, BatchTrace


class _Row:
    """One row's state: what run_rounds keeps in locals, per row."""

    def __init__(self, index: int, prompt: list[int], rule: DraftRule | None, generator: torch.Generator,
                 builder: TraceBuilder, max_new_tokens: int):
        self.index, self.ids, self.rule, self.generator, self.builder = index, list(prompt), rule, generator, builder
        self.max_new_tokens = max_new_tokens  # this row's own budget
        self.produced = 0
        self.pending: tuple = ()  # this round's verdict and what the recorder needs, kept until the round is recorded


def run_batch_rounds(target: RaggedRunner, drafter: BatchDrafter, rules: list[DraftRule | None], warp: Warp,
                     prompts: list[list[int]], max_new_tokens: list[int], eos_ids: set[int],
                     generators: list[torch.Generator], builders: list[TraceBuilder],
                     batch: BatchTrace) -> Iterator[BatchTrace]:
    """Decode every row until its EOS or its own max_new_tokens[r], yielding the batch trace after every round."""
    rows = [_Row(i, *row) for i, row in enumerate(zip(prompts, rules, generators, builders, max_new_tokens))]
    live = list(rows)  # batch index i holds live[i]
    clock = DecodeClock(target.device)
    try:
        prompts_but_pending = [row.ids[:-1] for row in live]  # prefill: the last prompt token is pending
        if drafter.wants_target_hidden:  # a prophet drafts from each prompt's last hidden state: from the prefill
            drafter.start([row.ids for row in live], target.forward(prompts_but_pending, last_only=True, hidden=True)[1])
        else:
            target.forward(prompts_but_pending, last_only=True)
            drafter.start([row.ids for row in live])
        batch.prefill_seconds = clock.prefill_done()
        for row in rows:
            row.builder.trace.prefill_seconds = batch.prefill_seconds
        while live:
            live = _round(target, drafter, live, warp, eos_ids, clock, batch)
            batch.decode_seconds = clock.total()
            with clock.paused():  # the consumer's time is not decode time
                yield batch
    finally:
        batch.decode_seconds = clock.total()
        for row in rows:  # rows still decoding when the run stopped early (a Stop, an error)
            if not row.builder.trace.stop_reason:
                _finish(row, "cancelled", clock)
        batch.summarize(target.peak_bytes + drafter.kv_peak_bytes())
        for row in rows:
            row.builder.trace.totals["peak_kv_bytes"] = batch.totals["peak_kv_bytes"]  # the whole batch's caches
            row.builder.trace.totals.update(drafter.summary())
        drafter.close()
        target.release()


def _round(target: RaggedRunner, drafter: BatchDrafter, live: list[_Row], warp: Warp, eos_ids: set[int],
           clock: DecodeClock, batch: BatchTrace) -> list[_Row]:
    """One round for every live row; returns the rows that go on."""
    # 1. propose, per row: at most budget - 1 drafts (decoders/loop.py)
    limits = [min(row.rule.limit() if row.rule else 0, row.max_new_tokens - row.produced - 1) for row in live]
    proposals = drafter.propose([row.ids for row in live], limits, [row.rule for row in live], warp,
                                [row.generator for row in live], any(row.builder.record for row in live))
    t_draft = float(clock.lap())
    # 2. score every row's chain in one batched target forward; 3. verify each row with its own generator
    logits = drafter.score(target, proposals)  # per row (N_r+1, V); early exit runs only layers k..L-1 here
    probs = [None if warp.greedy else warp.probs(row_logits) for row_logits in logits]  # (N_r+1, V) each
    verdicts = [verify(p.tree, lg, pr, row.generator) for p, lg, pr, row in zip(proposals, logits, probs, live)]
    t_verify = float(clock.lap())
    # 4. commit per row; each row's cache keeps its root and accepted drafts, its rejected slots become padding
    done, record = [], BatchRound(len(batch.rounds), [row.index for row in live], [], [], [])
    for i, (row, proposal, verdict) in enumerate(zip(live, proposals, verdicts)):
        tree = proposal.tree
        committed, hit_eos = _cut_at_eos([tree.tokens[n] for n in verdict.path] + [verdict.token], eos_ids)
        target.drop_row_tail(i, tree.size - 1 - verdict.n_accepted)
        n_before = len(row.ids)
        row.ids += committed
        row.produced += len(committed)
        drafter.observe(i, n_before, verdict.n_accepted)
        if row.rule:
            row.rule.observe_time(t_draft, proposal.forwards, t_verify, tree.size)
        rule_after = row.rule.update(verdict.n_accepted, tree.n_drafted) if row.rule else {}
        row.pending = (proposal, verdict, committed, logits[i], probs[i], rule_after, limits[i],
                       "eos" if hit_eos else "max_new_tokens" if row.produced >= row.max_new_tokens else None)
        record.drafted.append(tree.n_drafted)
        record.accepted.append(verdict.n_accepted)
        record.committed.append(len(committed))
    t_book = float(clock.lap())
    # 5. finished rows leave; trim and maybe compact what is left (the realignment, timed on its own)
    going = [i for i, row in enumerate(live) if row.pending[-1] is None]
    target.select_rows(going)
    drafter.select_rows(going)
    target.realign()
    drafter.realign()
    t_realign = float(clock.lap())
    seconds = {"draft": t_draft, "verify": t_verify, "bookkeeping": t_book + t_realign}
    for row in live:  # 6. record each row's round in its own trace (the recorder's time lands in the next lap)
        proposal, verdict, committed, row_logits, row_p, rule_after, limit, stop = row.pending
        readout = read_round(proposal.tree, row_logits, row_p, row.builder.record)
        row.builder.add_round(proposal, verdict, committed, readout, rule_after,
                              row.rule.name if row.rule else None, limit, dict(seconds))
        row.builder.trace.decode_seconds = clock.total()
        if stop:
            _finish(row, stop, clock)
            done.append(row.index)
    added, removed = (a + b for a, b in zip(target.take_padding_counts(), drafter.padding_counts()))
    record.finished, record.padding_added, record.padding_removed = done, added, removed
    record.padding_held, record.width = target.padding_held(), target.width
    record.seconds = {**seconds, "bookkeeping": t_book, "realign": t_realign}
    batch.rounds.append(record)
    return [live[i] for i in going]


def _finish(row: _Row, reason: str, clock: DecodeClock) -> None:
    row.builder.trace.decode_seconds = clock.total()
    row.builder.finish(reason)
