"""bench/trees.py on tiny models: every tree arm runs, equals the greedy baseline, and the table reports it."""
from __future__ import annotations

import pytest

from bench import trees
from decoders import DecodeOptions
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


def test_head_grown_trees_need_no_draft_model_and_race_transformers_own_methods():
    methods = trees.methods_for(grown_by_head=True)
    assert not any(m.needs_draft for m in methods)
    # transformers has no EAGLE head: its methods for a target without a draft model race in the same run
    hf = {m.key: m for m in methods if m.family == "hf"}
    assert set(hf) == {"hf/prompt-lookup", "hf/early-exit"}
    chain = next(m for m in methods if m.key == "ours/prompt-lookup")
    assert hf["hf/prompt-lookup"].options["prompt_lookup_num_tokens"] == chain.options["gamma"]
    assert hf["hf/prompt-lookup"].options["max_matching_ngram_size"] == DecodeOptions().ngram  # the same n-grams
    assert all(m.options.get("eagle_head") == "auto" for m in methods if m.kind in ("eagle1", "eagle2", "ddd"))


def _record(method: str, prompt: str, rep: int, tok_s: float) -> dict:
    return {"method": method, "prompt": prompt, "prompt_kind": "chat", "rep": rep, "tok_s": tok_s}


def test_eagle2_is_compared_with_transformers_fastest_method_of_the_same_run():
    speeds = {"ours/baseline": 10.0, "ours/eagle2-cost": 13.0, "hf/prompt-lookup": 20.0, "hf/early-exit": 5.0}
    records = [_record(m, p, rep, v * (1.1 if p == "b" else 1.0)) for m, v in speeds.items() for p in "ab"
               for rep in (0, 1)]
    rows = [{"method": m, "label": m, "speedup": v / 10 if m != "ours/baseline" else None} for m, v in speeds.items()]
    versus = trees.versus_best_peer(records, rows)
    assert versus["peer"] == "hf/prompt-lookup" and versus["ratio"] == pytest.approx(13 / 20)
    rows[2]["speedup"] = 0.1  # were early exit transformers' faster method, EAGLE-2 would be compared with it
    assert trees.versus_best_peer(records, rows)["peer"] == "hf/early-exit"
    assert trees.versus_best_peer(records, [r for r in rows if not r["method"].startswith("hf/")]) is None


def test_the_table_takes_a_peer_whose_draft_counts_are_not_separable():
    """transformers' early exit drafts and verifies on one model object: its accepted/drafted/τ are None."""
    methods = trees.methods_for(grown_by_head=True)
    records = [dict(_record(m.key, "a", 0, 10.0), accepted=None if m.key == "hf/early-exit" else 3,
                    drafted=None if m.key == "hf/early-exit" else 6, target_forwards=None if m.key == "hf/early-exit"
                    else 4, tau=None if m.key == "hf/early-exit" else 2.0, identical_to_baseline=True)
               for m in methods]
    rows = {r["method"]: r for r in trees.summarize(records, methods)}
    assert rows["hf/early-exit"]["accepted_per_round"] is None and rows["hf/early-exit"]["tau"] is None
    assert rows["ours/eagle2-cost"]["accepted_per_round"] == 1.0 and rows["ours/eagle2-cost"]["speedup"] == 1.0
