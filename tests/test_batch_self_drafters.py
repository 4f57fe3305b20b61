"""Batched decoding with the learned self-drafters (issue 26 in decoders/batch): early exit and prophet.

The defining property of decoders/batch holds for them too: every row's output equals that row decoded alone
(greedy float32, rounding flips reported; sampling with per-row seeds, token for token), with prompts of very
different lengths and rows that end early. Early exit keeps its reuse of layers 0..k-1 in the batch: verification
runs only layers k..L-1 and the stem layers' round slots are relaid into the verification block, so breaking that
relayout for one row, or a position id for one row, must make the comparison fail.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_batch import SEEDS, check_rows, prompts_for, run_both

from decoders import DecodeOptions, generate_batch
from decoders.batch import batched_drafters
from decoders.batch import drafters as batch_drafters
from decoders.batch.ragged import RaggedRunner
from decoders.selfdraft import store
from decoders.selfdraft.heads import ExitBlock, Prophet


@pytest.fixture(scope="module")
def weights(tiny, tmp_path_factory):
    """An exit block after layer 2 of the 4-layer tiny target (reduced vocabulary) and a 1-layer prophet, both
    perturbed so that drafts are sometimes rejected: rows then advance at different rates."""
    folder = tmp_path_factory.mktemp("self-weights")
    torch.manual_seed(0)
    block = ExitBlock(tiny.model, 2, vocab_ids=torch.arange(48))
    prophet = Prophet(tiny.model, 1)
    with torch.no_grad():
        for p in block.layers.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for p in prophet.parameters():
            p.add_(0.02 * torch.randn_like(p))
    store.save(block, folder / "early-exit")
    store.save(prophet, folder / "prophet")
    return {"early-exit": str(folder / "early-exit"), "prophet": str(folder / "prophet")}


def options_for(name: str, weights: dict, **changes) -> DecodeOptions:
    base = DecodeOptions(method="speculative", drafter=name, self_weights=weights[name], rule="adaedl", max_draft=5,
                         max_new_tokens=14)
    return replace(base, **changes)


def test_the_self_drafters_have_a_batched_form():
    assert {"early-exit", "prophet"} <= set(batched_drafters())


@pytest.mark.parametrize("batch_size", [1, 2, 5, 8])
@pytest.mark.parametrize("name", ["early-exit", "prophet"])
def test_every_row_equals_that_row_alone_greedy(tiny, weights, name, batch_size):
    rounding: list[str] = []
    batch, singles = run_both(options_for(name, weights), prompts_for(batch_size), tiny)
    assert check_rows(batch, singles, rounding, tiny.model) == []
    assert len(batch) == batch_size and all(row.output_ids for row in batch)
    if batch_size == 8:  # not vacuous: drafts were accepted, and rows accepted different counts in a round
        assert sum(a for rnd in batch.rounds for a in rnd.accepted) > 0
        assert any(len(set(rnd.accepted)) > 1 for rnd in batch.rounds)
    if rounding:
        print("rounding flips (allowed, reported):", *rounding, sep="\n  ")


@pytest.mark.parametrize("batch_size", [3, 8])
@pytest.mark.parametrize("name", ["early-exit", "prophet"])
def test_every_row_samples_as_that_row_alone_with_its_seed(tiny, weights, name, batch_size):
    options = options_for(name, weights, temperature=0.9, top_k=20)
    batch, singles = run_both(options, prompts_for(batch_size), tiny, seeds=SEEDS[:batch_size])
    assert check_rows(batch, singles) == []
    assert len({tuple(row.output_ids) for row in batch}) > 1


@pytest.mark.parametrize("name", ["early-exit", "prophet"])
def test_rows_end_early_at_their_eos_or_their_own_budget(tiny, weights, name):
    prompts = prompts_for(5)
    plain = generate_batch(DecodeOptions(max_new_tokens=12), prompts, target=tiny)
    eos = plain[2].output_ids[2]  # row 2 meets this token early, so it ends at EOS
    lm = tiny.with_eos(eos)
    caps = [12, 12, 12, 3, 12]  # row 3 has its own, shorter budget
    batch, singles = run_both(options_for(name, weights, max_new_tokens=12), prompts, lm, caps=caps)
    assert check_rows(batch, singles) == []
    assert batch[2].stop_reason == "eos" and len(batch[2].output_ids) <= 3
    finished_at = {row: rnd.index for rnd in batch.rounds for row in rnd.finished}
    assert finished_at[2] < len(batch.rounds) - 1  # it left while others went on
    assert all(2 not in rnd.rows for rnd in batch.rounds[finished_at[2] + 1:])


def test_early_exit_verification_reuses_the_stem_in_the_batch(tiny, weights):
    """Layers 0..k-1 run once per token (while drafting); verification's work on them is counted as reused."""
    batch = generate_batch(options_for("early-exit", weights), prompts_for(4), target=tiny)
    info = batch[0].totals["self_draft"]
    assert info["kind"] == "early-exit" and info["exit_layer"] == 2
    verified = sum(rnd.drafted[i] + 1 for rnd in batch.rounds for i in range(len(rnd.rows)))
    assert 0 < info["reused_layer_tokens"] <= 2 * verified
    assert info["reused_layer_tokens"] >= 2 * (verified - sum(len(rnd.rows) for rnd in batch.rounds))


def _breaks(tiny, weights, name, monkeypatch, patch) -> list[str]:
    patch(monkeypatch)
    batch, singles = run_both(options_for(name, weights), prompts_for(4), tiny)
    return check_rows(batch, singles)


@pytest.mark.parametrize("name", ["early-exit", "prophet"])
def test_a_position_id_off_by_one_for_one_row_is_caught(tiny, weights, monkeypatch, name):
    honest = RaggedRunner._positions

    def off_by_one(self, row, start, count):
        return honest(self, row, start, count) + (1 if row == 1 and start > 0 else 0)

    failures = _breaks(tiny, weights, name, monkeypatch, lambda mp: mp.setattr(RaggedRunner, "_positions", off_by_one))
    assert failures and failures[0].startswith("row 1: ")


def test_a_stem_relayout_off_by_one_slot_for_one_row_is_caught(tiny, weights, monkeypatch):
    """Row 1's stem-layer entries land one slot early after verification: its layers 0..k-1 then see a stale
    neighbour instead of its own tokens, and the comparison must say so."""
    def shifted(self, width, n):
        index = torch.zeros(self.target.batch, n, dtype=torch.long)
        for r in range(self.target.batch):
            real = width + self.stem_valid[r].nonzero().flatten() - (1 if r == 1 else 0)
            index[r, n - len(real):] = real
        for layer in self.target.cache.layers[: self.k]:
            for attr in ("keys", "values"):
                tensor = getattr(layer, attr)
                gather = index[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                setattr(layer, attr, torch.cat([tensor[:, :, :width], tensor.gather(2, gather)], dim=2))

    failures = _breaks(tiny, weights, "early-exit", monkeypatch,
                       lambda mp: mp.setattr(batch_drafters.BatchEarlyExit, "_relay_stem", shifted))
    assert failures and any(line.startswith("row 1: ") for line in failures)


def test_the_cli_and_the_batch_tab_offer_them(tiny, weights, monkeypatch, capsys):
    from app.tabs.batch import handlers
    from decoders import api
    from decoders.__main__ import main

    assert handlers.options_for("smollm2-135m", "batched speculative", "early-exit", 12, 0.0).drafter == "early-exit"
    monkeypatch.setattr(api, "_load", lambda name, options, quant=None: tiny)
    code = main(["run", "--prompt", "abc", "--prompt", "a longer second prompt", "--method", "speculative",
                 "--drafter", "early-exit", "--self-weights", weights["early-exit"], "--max-new-tokens", "6",
                 "--check-rows", "--no-chat"])
    text = capsys.readouterr().out
    assert code == 0 and text.count("same as this row decoded alone") == 2, text
