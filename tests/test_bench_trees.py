"""bench/trees.py on tiny models: every tree arm runs, equals the greedy baseline, and the table reports it."""
from __future__ import annotations

import pytest

from bench import trees
from bench.runner import Prompt, run_suite

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_tree_bench_runs_every_arm_and_each_equals_the_baseline(tiny, drafts):
    methods = trees.methods_for(grown_by_head=False)
    assert {m.kind for m in methods} == {"baseline", "draft-model", "eagle1", "eagle2", "ddd"}
    assert [m.key for m in methods if m.family == "hf"] == ["hf/assisted@packed"]  # HF's peer in the same run
    methods = [m for m in methods if m.family == "ours"]  # tiny models are not transformers models
    assert all(m.needs_draft for m in methods if m.kind in ("eagle1", "eagle2", "ddd"))  # grown by the draft model
    prompts = [Prompt("a", "chat", "", [3, 9, 4, 1, 7]), Prompt("b", "code-writing", "", [5, 5, 2, 8])]
    records = run_suite(methods, {"target": tiny, "draft": drafts["noisy"]}, prompts, reps=2, max_new_tokens=16,
                        log=lambda *a: None, warmup=False)
    rows = trees.summarize(records, methods)
    assert [r["identical"] for r in rows] == ["4/4"] * len(methods)
    paper = next(r for r in rows if r["method"] == "ours/eagle2-paper")
    sized = next(r for r in rows if r["method"] == "ours/eagle2-cost")
    assert paper["drafted_per_round"] > sized["drafted_per_round"]  # M 59 sends more than the cost-aware tree
    assert paper["peak_kv_mib"] > next(r for r in rows if r["method"] == "ours/baseline")["peak_kv_mib"]
    result = {"settings": {"target": "tiny", "dtype": "float32", "device": "cpu", "prompts": 2, "kinds": ["chat"],
                           "reps": 2, "max_new_tokens": 16, "threads": 1, "machine": "test", "command": "x",
                           "minutes": 0.0}, "rows": rows}
    table = trees.markdown(result)
    assert table.count("\n| ") == len(methods) + 1 and "1 (yardstick)" in table


def test_head_grown_trees_need_no_draft_model():
    methods = trees.methods_for(grown_by_head=True)
    assert not any(m.needs_draft for m in methods)
    assert all(m.options.get("eagle_head") == "auto" for m in methods if m.kind in ("eagle1", "eagle2", "ddd"))
