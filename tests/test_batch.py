"""Batched decoding with ragged rows (decoders/batch): every row's output equals that row decoded alone.

Greedy float32 rows are compared with decoders/compare.py: "same" passes, "rounding" (a near-tie the batched forward
ranks the other way, with both logits within a float32 forward's measured error of a float64 re-score) passes and is
reported where the test hands the model over, anything else fails. Sampled rows (per-row seeds) must be identical
token for token: the same seed gives the same draws batched or alone. Two broken realignments (a position id off
by one for one row; one row's rejected drafts left visible) must make the comparison fail.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from decoders import DecodeOptions, OptionsError, generate, generate_batch, stream_batch
from decoders.batch import BatchTrace
from decoders.batch.ragged import RaggedRunner
from decoders.compare import compare

LENGTHS = [1, 37, 4, 60, 9, 2, 23, 14]  # very different prompt lengths, one row per entry (B up to 8)
SEEDS = [101, 7, 55, 3, 999, 42, 0, 8]


def prompts_for(batch: int, vocab: int = 64) -> list[list[int]]:
    """Prompt r: LENGTHS[r] tokens; every other prompt repeats a phrase, so prompt lookup finds matches there."""
    out = []
    for r in range(batch):
        n = LENGTHS[r]
        phrase = [(5 * r + k) % vocab for k in range(5)]
        out.append((phrase * n)[:n] if r % 2 else [(13 * r + 7 * k * k) % vocab for k in range(n)])
    return out


OPTIONS = {
    "baseline": DecodeOptions(method="baseline"),
    "draft-model": DecodeOptions(method="speculative", drafter="draft-model", gamma=3),
    "draft-model-adaedl": DecodeOptions(method="speculative", drafter="draft-model", rule="adaedl", max_draft=5),
    "prompt-lookup": DecodeOptions(method="speculative", drafter="prompt-lookup", gamma=4),
    "layer-skip": DecodeOptions(method="speculative", drafter="layer-skip", skip_layers=(1, 2), rule="heuristic"),
}


def check_rows(batch: BatchTrace, singles: list, report: list | None = None, model=None) -> list[str]:
    """Failures (one line per row that differs other than by rounding); rounding flips go to `report`. A greedy
    difference is re-scored on `model` (decoders/compare.py); without it, it stays unclassified: a failure."""
    failures = []
    for r, (row, alone) in enumerate(zip(batch, singles)):
        verdict = compare(row, alone, model)
        if verdict.kind == "sampled":
            if row.output_ids != alone.output_ids:
                failures.append(f"row {r}: sampled {row.output_ids} alone {alone.output_ids}")
        elif verdict.kind == "rounding":
            if report is not None:
                report.append(f"row {r}: {verdict.line()}")
        elif verdict.kind != "same":
            failures.append(f"row {r}: {verdict.line()}")
    return failures


def run_both(options: DecodeOptions, prompts, target, draft=None, seeds=None, caps=None):
    batch = generate_batch(options, prompts, seeds=seeds, target=target, draft=draft, max_new_tokens=caps)
    singles = [generate(replace(options, seed=seeds[r] if seeds else options.seed,
                                max_new_tokens=caps[r] if caps else options.max_new_tokens),
                        p, target=target, draft=draft) for r, p in enumerate(prompts)]
    return batch, singles


def _draft(name, drafts):
    return drafts["noisy"] if OPTIONS[name].drafter == "draft-model" and OPTIONS[name].method == "speculative" else None


@pytest.mark.parametrize("batch_size", range(1, 9))
@pytest.mark.parametrize("name", ["baseline", "draft-model", "prompt-lookup", "layer-skip"])
def test_every_row_equals_that_row_alone_greedy(tiny, drafts, name, batch_size):
    options = replace(OPTIONS[name], max_new_tokens=14)
    rounding: list[str] = []
    batch, singles = run_both(options, prompts_for(batch_size), tiny, _draft(name, drafts))
    assert check_rows(batch, singles, rounding, tiny.model) == []
    assert len(batch) == batch_size and all(row.output_ids for row in batch)
    if rounding:
        print("rounding flips (allowed, reported):", *rounding, sep="\n  ")


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("name", ["baseline", "draft-model", "draft-model-adaedl", "prompt-lookup", "layer-skip"])
def test_every_row_samples_as_that_row_alone_with_its_seed(tiny, drafts, name, batch_size):
    options = replace(OPTIONS[name], max_new_tokens=14, temperature=0.9, top_k=20)
    batch, singles = run_both(options, prompts_for(batch_size), tiny, _draft(name, drafts), SEEDS[:batch_size])
    assert check_rows(batch, singles) == []
    if batch_size > 1:  # different seeds really do give different rows (the comparison is not vacuous)
        assert len({tuple(row.output_ids) for row in batch}) > 1


def test_rows_that_accept_everything_and_rows_that_accept_nothing(tiny, drafts):
    options = replace(OPTIONS["draft-model"], max_new_tokens=16)
    prompts = prompts_for(6)
    every, singles = run_both(options, prompts, tiny, drafts["same"])  # the target drafts for itself
    assert check_rows(every, singles) == []
    assert all(a == d for rnd in every.rounds for a, d in zip(rnd.accepted, rnd.drafted))
    none, singles = run_both(options, prompts, tiny, drafts["unrelated"])
    assert check_rows(none, singles) == []
    accepted = [a for rnd in none.rounds for a in rnd.accepted]
    assert accepted.count(0) > len(accepted) // 2


def test_rows_advance_at_different_rates_within_a_round(tiny, drafts):
    batch, singles = run_both(replace(OPTIONS["draft-model"], max_new_tokens=24), prompts_for(8), tiny, drafts["noisy"])
    assert check_rows(batch, singles) == []
    assert any(len(set(rnd.accepted)) > 1 for rnd in batch.rounds)  # ragged: rows accepted different counts
    assert any(rnd.padding_removed > 0 for rnd in batch.rounds)  # realignment freed padding at some point


def forced_compaction(monkeypatch, compact=None) -> list[tuple[int, int, int]]:
    """realign compacts after every round that left a hole (not only past a quarter of the width and 8 columns,
    which these short runs rarely reach: trim alone then satisfies padding_removed > 0). Returns the log of
    compactions, (rows, width before, width after); `compact` replaces the real one (a mutation)."""
    done, honest = [], compact or RaggedRunner.compact

    def logged(self):
        before = self.width
        honest(self)
        done.append((self.batch, before, self.width))

    def realign(self, min_free=8):
        if self.batch == 0:
            return
        self.trim()
        if self.removable() > 0:
            self.compact()

    monkeypatch.setattr(RaggedRunner, "compact", logged)
    monkeypatch.setattr(RaggedRunner, "realign", realign)
    return done


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup", "layer-skip"])
def test_every_row_equals_that_row_alone_when_every_round_compacts(tiny, drafts, monkeypatch, name):
    done = forced_compaction(monkeypatch)
    batch, singles = run_both(replace(OPTIONS[name], max_new_tokens=24), prompts_for(8), tiny, _draft(name, drafts))
    assert check_rows(batch, singles) == []
    assert any(after < before for _, before, after in done), done  # compaction itself freed columns


def test_rows_that_finish_and_then_compact_equal_their_rows_alone(tiny, drafts, monkeypatch):
    """Rows leave (one at its EOS, one at its own budget), then the rows left compact: the gather must follow the
    batch indices as they are after select_rows."""
    prompts = prompts_for(5)
    eos = generate_batch(DecodeOptions(max_new_tokens=12), prompts, target=tiny)[2].output_ids[2]
    lm = tiny.with_eos(eos)
    done = forced_compaction(monkeypatch)
    batch, singles = run_both(replace(OPTIONS["draft-model"], max_new_tokens=20), prompts, lm, drafts["noisy"],
                              caps=[20, 20, 20, 3, 20])
    assert check_rows(batch, singles) == []
    first_leave = min(rnd.index for rnd in batch.rounds if rnd.finished)
    assert first_leave < len(batch.rounds) - 1
    assert any(rows < 5 and after < before for rows, before, after in done), done  # compacted after rows left


def test_a_compaction_that_loses_a_slot_is_caught(tiny, drafts, monkeypatch):
    """The mutation the forced-compaction tests guard against: row 0's newest real slot is overwritten with its
    oldest one during the gather (one token's keys lost, another's duplicated)."""
    honest = RaggedRunner.compact

    @torch.inference_mode()
    def lossy(self):
        newest = int(self.valid[0].nonzero().flatten()[-1]) if self.batch else 0
        oldest = int(self.valid[0].nonzero().flatten()[0]) if self.batch else 0
        for layer in self._layers():
            for name in ("keys", "values"):
                getattr(layer, name)[0, :, newest] = getattr(layer, name)[0, :, oldest]
        honest(self)

    forced_compaction(monkeypatch, lossy)
    batch, singles = run_both(replace(OPTIONS["draft-model"], max_new_tokens=24), prompts_for(8), tiny,
                              drafts["noisy"])
    failures = check_rows(batch, singles)
    assert failures and failures[0].startswith("row 0")


def test_rows_end_early_at_their_eos_or_their_own_budget(tiny, drafts):
    prompts = prompts_for(5)
    plain = generate_batch(DecodeOptions(max_new_tokens=12), prompts, target=tiny)
    eos = plain[2].output_ids[2]  # row 2 meets this token early, so it ends at EOS
    lm = tiny.with_eos(eos)
    caps = [12, 12, 12, 3, 12]  # row 3 has its own, shorter budget
    for name in ("baseline", "draft-model", "prompt-lookup"):
        options = replace(OPTIONS[name], max_new_tokens=12)
        batch, singles = run_both(options, prompts, lm, _draft(name, drafts), caps=caps)
        assert check_rows(batch, singles) == []
        assert batch[2].stop_reason == "eos" and len(batch[2].output_ids) <= 3
        assert batch[3].stop_reason in ("max_new_tokens", "eos") and len(batch[3].output_ids) <= 3
        finished_at = {row: rnd.index for rnd in batch.rounds for row in rnd.finished}
        assert finished_at[2] < len(batch.rounds) - 1  # it left while others went on
        assert all(2 not in rnd.rows for rnd in batch.rounds[finished_at[2] + 1:])


def _breaks(tiny, drafts, monkeypatch, name, patch) -> list[str]:
    patch(monkeypatch)
    options = replace(OPTIONS[name], max_new_tokens=14)
    batch, singles = run_both(options, prompts_for(4), tiny, _draft(name, drafts))
    return check_rows(batch, singles, model=tiny.model)


@pytest.mark.parametrize("name", ["baseline", "draft-model"])
def test_a_position_id_off_by_one_for_one_row_is_caught(tiny, drafts, monkeypatch, name):
    """Row 1's tokens after its prompt get positions one too far. (Shifting a whole row, prompt included, would
    change nothing: rotary positions only enter through differences. The bug that matters opens a gap.)"""
    honest = RaggedRunner._positions

    def off_by_one(self, row, start, count):
        return honest(self, row, start, count) + (1 if row == 1 and start > 0 else 0)

    failures = _breaks(tiny, drafts, monkeypatch, name,
                       lambda mp: mp.setattr(RaggedRunner, "_positions", off_by_one))
    assert failures and failures[0].startswith("row 1: ") and all("mismatch" in line for line in failures)
    # (a row that later moves into batch index 1, after a row leaves, is shifted too: it may fail as well)


def test_positions_counted_from_slots_padding_included_are_caught(tiny, drafts, monkeypatch):
    """The classic ragged-batch bug: position = slot index, so a row's padding pushes its positions."""
    def from_slots(self, row, start, count):
        return torch.arange(self.width, self.width + count)

    failures = _breaks(tiny, drafts, monkeypatch, "draft-model",
                       lambda mp: mp.setattr(RaggedRunner, "_positions", from_slots))
    assert failures and all("mismatch" in line for line in failures)


def test_rejected_drafts_left_visible_in_one_row_are_caught(tiny, drafts, monkeypatch):
    honest = RaggedRunner.drop_row_tail

    def forgetful(self, row, count):  # the target's row 0 keeps its rejected drafts in its cache
        if self.model is tiny.model and row == 0 and self.batch == 4:
            self.lengths[row] -= count  # positions stay right; only the cache is stale
            return
        honest(self, row, count)

    failures = _breaks(tiny, drafts, monkeypatch, "draft-model",
                       lambda mp: mp.setattr(RaggedRunner, "drop_row_tail", forgetful))
    assert failures and failures[0].startswith("row 0")


def test_stream_yields_every_round_and_stop_frees_the_caches(tiny, drafts):
    options = replace(OPTIONS["draft-model"], max_new_tokens=20)
    stream = stream_batch(options, prompts_for(3), target=tiny, draft=drafts["noisy"])
    first = next(stream)
    assert len(first.rounds) == 1 and all(len(row.rounds) == 1 for row in first)
    second = next(stream)
    assert len(second.rounds) == 2
    stream.close()  # a Stop button
    assert all(row.stop_reason == "cancelled" for row in second)
    assert second.totals["peak_kv_bytes"] > 0


def test_batch_trace_round_trips_and_totals_add_up(tiny, drafts):
    batch = generate_batch(replace(OPTIONS["prompt-lookup"], max_new_tokens=10), prompts_for(4), target=tiny)
    again = BatchTrace.from_json(batch.to_json())
    assert again.output_ids == batch.output_ids and len(again.rounds) == len(batch.rounds)
    totals = batch.totals
    assert totals["tokens"] == sum(len(row.output_ids) for row in batch) == 40
    assert 0 <= totals["realign_share"] < 1 and len(totals["tau"]) == 4
    for rnd in batch.rounds:
        assert len(rnd.rows) == len(rnd.accepted) == len(rnd.committed)
        assert rnd.seconds["realign"] >= 0


@pytest.mark.parametrize("call, message", [
    (lambda lm: generate_batch(DecodeOptions(), [], target=lm), "1 to 8 prompts"),
    (lambda lm: generate_batch(DecodeOptions(), [[1]] * 9, target=lm), "batches of 8"),
    (lambda lm: generate_batch(DecodeOptions(), [[1], [2]], seeds=[1], target=lm), "one seed per prompt"),
    (lambda lm: generate_batch(DecodeOptions(), [[1], [2]], max_new_tokens=[3], target=lm), "one per prompt"),
    (lambda lm: generate_batch(DecodeOptions(), [[1], [2]], max_new_tokens=[3, 0], target=lm), "max_new_tokens"),
    (lambda lm: generate_batch(DecodeOptions(method="speculative", drafter="eagle2"), [[1]], target=lm),
     "chain drafters"),
    (lambda lm: generate_batch(DecodeOptions(method="beam-search"), [[1]], target=lm), "baseline"),
    (lambda lm: generate_batch(DecodeOptions(), [[1], []], target=lm), "no tokens"),
    (lambda lm: generate_batch(DecodeOptions(), "one prompt", target=lm), "list of prompts"),
    (lambda lm: generate_batch(DecodeOptions(), [[1, 2], 3], target=lm), "a text or a list of token ids"),
])
def test_bad_batch_input_gets_a_clear_message(tiny, call, message):
    with pytest.raises(OptionsError, match=message):
        call(tiny)


def test_sliding_window_models_are_refused_with_a_reason():
    from tiny import tiny_gemma3

    with pytest.raises(OptionsError, match="sliding-window"):
        generate_batch(DecodeOptions(), [[1, 2], [3]], target=tiny_gemma3())


def test_cli_decodes_several_prompts_as_one_batch(tiny, monkeypatch, capsys, tmp_path):
    from decoders import api
    from decoders.__main__ import main

    monkeypatch.setattr(api, "_load", lambda name, options, quant=None: tiny)
    listed = tmp_path / "prompts.json"
    listed.write_text('["a longer third prompt, abab abab abab", "4th"]')
    out = tmp_path / "batch.json"
    code = main(["run", "--prompt", "abc", "--prompt", "hello there", "--prompts-file", str(listed), "--method",
                 "speculative", "--drafter", "prompt-lookup", "--max-new-tokens", "8", "--check-rows", "--no-chat",
                 "--trace", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert [f"--- row {r}" in text for r in range(4)] == [True] * 4
    assert text.count("same as this row decoded alone") == 4 and "rows=4 tokens=32" in text
    assert len(BatchTrace.from_json(out.read_text())) == 4


@pytest.mark.parametrize("content, suffix, message", [
    ("{not json", ".json", "is not valid JSON"),
    ('{"a": 1}', ".json", "list of prompt strings"),
    ("\n\n", ".txt", "give a prompt"),
])
def test_cli_bad_prompts_file_is_one_line(tiny, monkeypatch, capsys, tmp_path, content, suffix, message):
    from decoders import api
    from decoders.__main__ import main

    monkeypatch.setattr(api, "_load", lambda name, options, quant=None: tiny)
    path = tmp_path / f"prompts{suffix}"
    path.write_text(content)
    assert main(["run", "--prompts-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _second_token_marginal(lm, prompt: list[int]) -> torch.Tensor:
    """P(second generated token) under the target at temperature 1: sum over t1 of p(t1) p(t2 | t1). (V,)"""
    with torch.no_grad():
        first = torch.softmax(lm.model(torch.tensor([prompt])).logits[0, -1].float(), -1)  # (V,)
        vocab = first.shape[0]
        rows = torch.tensor([prompt + [t] for t in range(vocab)])  # (V, P+1)
        second = torch.softmax(lm.model(rows).logits[:, -1].float(), -1)  # (V, V): row t1 = p(. | t1)
    return first @ second  # (V,)


def _second_tokens(tiny, draft, batches: int = 50) -> torch.Tensor:
    prompt = [3, 1, 4, 1, 5]
    options = DecodeOptions(method="speculative", drafter="draft-model", gamma=3, max_new_tokens=2, temperature=1.0)
    counts = torch.zeros(tiny.model.config.vocab_size)
    for i in range(batches):
        batch = generate_batch(options, [prompt] * 8, seeds=list(range(8 * i, 8 * i + 8)), target=tiny, draft=draft)
        for row in batch:
            counts[row.output_ids[1]] += 1
    return counts


def test_batched_sampling_matches_the_target_distribution(tiny, drafts, monkeypatch):
    """Chi-square on the second token (a draft accepted or a residual draw in round 1), 400 rows in batches of 8,
    drafted by an unrelated model; the negative control accepts every draft and must fail."""
    from chi_square import chi_square_pvalue
    from decoders.batch import loop as batch_loop
    from decoders.sampling import sample
    from decoders.verify import Source, Verdict

    expected = _second_token_marginal(tiny, [3, 1, 4, 1, 5])
    assert chi_square_pvalue(_second_tokens(tiny, drafts["unrelated"]), expected) > 1e-3

    def accept_every_draft(tree, logits, p, generator):
        return Verdict(list(range(1, tree.size)), sample(p[-1], generator), Source.BONUS)

    monkeypatch.setattr(batch_loop, "verify", accept_every_draft)
    assert chi_square_pvalue(_second_tokens(tiny, drafts["unrelated"]), expected) < 1e-3


@pytest.mark.parametrize("name", ["draft-model", "draft-model-adaedl"])
def test_an_int8_draft_samples_each_row_as_it_would_alone(tiny, drafts, name):
    """Issue 33 item 3: an int8 draft's activations are quantized per token (decoders/runtime/kernels.py Int8Linear), so a
    row's q does not depend on the other rows or the pad slots. With fbgemm's per-call activation range (one scale
    over every row and pad of the batch) the sampled rows drift from their single runs."""
    from test_quantize import int8_copy

    draft = int8_copy(drafts["noisy"])
    options = replace(OPTIONS[name], max_new_tokens=14, temperature=0.9, top_k=20)
    batch, singles = run_both(options, prompts_for(8), tiny, draft, SEEDS[:8])
    assert check_rows(batch, singles) == []
    assert sum(rnd.n_drafted for row in batch for rnd in row.rounds) > 0


def _draft_qs(trace) -> list[list[float]]:
    return [[node.q for node in rnd.nodes if node.q is not None] for rnd in trace.rounds]


@pytest.mark.parametrize("seeds", [[5, 6, 7], [11, 12, 13, 14], SEEDS[:8]])
def test_an_int8_draft_computes_each_rows_q_as_alone_bit_for_bit(tiny, drafts, seeds):
    """Issue 47 item 10: a batched forward sums in other orders than a one-row forward (the ragged cache's padded
    width and mask, matmuls blocked by the row count), and an int8 draft's per-token quantization turns a last-bit
    difference into a whole level wherever an activation sits at a rounding boundary: on the Qwen pair a sampled
    row drew another draft than alone. The int8 draft now drafts each row alone, so every draft's q is the single
    run's exactly (not merely close) and the rows' outputs are the single runs'."""
    from test_quantize import int8_copy

    draft = int8_copy(drafts["noisy"])
    options = DecodeOptions(method="speculative", drafter="draft-model", gamma=3, max_new_tokens=16, temperature=0.8)
    batch, singles = run_both(options, prompts_for(len(seeds)), tiny, draft, seeds)
    for r, (row, alone) in enumerate(zip(batch, singles)):
        assert row.output_ids == alone.output_ids, (r, row.output_ids, alone.output_ids)
        assert _draft_qs(row) == _draft_qs(alone), f"row {r}: its int8 draft's q differs from its single run's"
    assert sum(len(qs) for row in batch for qs in _draft_qs(row)) > 3 * len(seeds)  # the rows drafted


def test_cli_check_rows_passes_on_a_sampled_batch_with_an_int8_draft(tiny, drafts, monkeypatch, capsys):
    """The review's failing scenario, on tiny models: `--drafter draft-model --draft-quant int8 --temperature 0.8
    --prompt A --prompt B --seeds 1,2 --check-rows` printed "mismatch" and exited 1 (per-call activation scales)."""
    from decoders import api
    from decoders.__main__ import main
    from test_quantize import int8_copy

    int8 = int8_copy(drafts["noisy"])
    monkeypatch.setattr(api, "_load", lambda name, options, quant=None, progress=None: int8 if quant else tiny)
    monkeypatch.setattr(api, "check_draft_before_loading", lambda options, target=None: None)  # no tokenizers here
    code = main(["run", "--model", "qwen2.5-coder-1.5b", "--prompt", "abcabc abc", "--prompt", "hello there, hello", "--prompt", "xyz", "--method",
                 "speculative", "--drafter", "draft-model", "--draft-quant", "int8", "--temperature", "0.8",
                 "--seeds", "1,2,3", "--max-new-tokens", "16", "--check-rows", "--no-chat"])
    text, err = capsys.readouterr()
    assert code == 0, text + err
    assert text.count("same as this row decoded alone") == 3
