"""bench/controller.py on tiny models: SpecLab's arms run, equal the baseline at T 0, and the table reports the
controller's caps next to the fixed presets (transformers' arms need real transformers weights: not run here)."""
from __future__ import annotations

import pytest

from bench import controller
from bench.runner import Prompt, run_suite

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_pair_arms_cover_the_issue_s_comparison():
    keys = {m.key for m in controller.pair_methods({"num_assistant_tokens": 10, "assistant_confidence_threshold": 0.6,
                                                    "num_assistant_tokens_schedule": "heuristic"}, 0.0)}
    assert {"ours/chain-cost", "ours/tree-cost", "ours/adaedl-8", "ours/eagle2-paper", "hf/assisted-defaults",
            "hf/assisted-tuned", "hf/prompt-lookup", "hf/greedy"} <= keys
    sampled = controller.pair_methods(dict(controller.peers.ASSISTED_DEFAULTS), 1.0)
    assert all(m.temperature == 1.0 for m in sampled) and all(m.key.endswith("@t1") for m in sampled)


def test_speclab_arms_run_and_the_table_reads():
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(layers=4)  # its own models: the bench packs the models it runs (session ones stay stock)
    draft = noisy_copy(target, noise=0.02)
    methods = [m for m in controller.pair_methods(dict(controller.peers.ASSISTED_DEFAULTS), 0.0) if m.family == "ours"]
    prompts = [Prompt("a", "chat", "", [3, 9, 4, 1, 7]), Prompt("b", "code-writing", "", [10, 11, 12, 10, 11])]
    records = run_suite(methods, {"target": target, "draft": draft}, prompts, reps=1, max_new_tokens=12,
                        log=lambda *a: None, warmup=False)
    assert all(r["identical_to_baseline"] for r in records)
    rows = controller.rows(records, methods)
    chain = next(r for r in rows if r["method"] == "ours/chain-cost" and r["kind"] == "all")
    assert chain["mean_cap"] is not None and chain["speedup"] is not None
    curve = {"model": "tiny", "step_seconds": 0.01, "chain": {"2": 1.1, "4": 1.2}}
    table = controller.markdown({"settings": {"target": "tiny", "machine": "test", "command": "x", "prompts": 2,
                                              "reps": 1, "max_new_tokens": 12, "threads": 1, "minutes": 0.0},
                                 "costs": {"target": curve}, "rows": rows, "records": records,
                                 "assisted_tuned": {"num_assistant_tokens": 20, "assistant_confidence_threshold": 0.4,
                                                    "num_assistant_tokens_schedule": "constant"}})
    assert "cost-aware cap (controller" in table and "t(2) 1.10" in table
    assert "| ours/static-4 | chat | " in table  # the fixed chain's acceptance by depth


def test_acceptance_by_depth_counts_each_depth_only_where_it_was_tested():
    records = [{"method": "ours/static-4", "prompt_kind": "chat", "rounds": [[4, 0], [4, 4], [4, 2], [3, 1]]},
               {"method": "ours/static-4", "prompt_kind": "chat", "rounds": [[4, 3]]},
               {"method": "ours/static-4", "prompt_kind": "code-writing", "rounds": [[4, 0]]},
               {"method": "ours/static-4@t1", "prompt_kind": "chat", "rounds": [[4, 0]]}]
    # depth 1: tested 5 times, accepted 4; depth 2 (after 1 accepted): 4, 3; depth 3: 3, 2; depth 4: 2 (the 4,4
    # and the 4,3 rounds), 1; depth 5: never drafted
    assert controller.acceptance_by_depth(records, "ours/static-4", "chat", depths=5) == [0.8, 0.75, 2 / 3, 0.5, None]
    assert controller.acceptance_by_depth(records, "ours/static-4", "code-writing", depths=2) == [0.0, None]


def test_a_focused_rerun_keeps_only_the_named_methods_and_the_baseline(monkeypatch, tmp_path):
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(layers=4)
    models = {"target": target, "draft": noisy_copy(target, noise=0.02)}
    monkeypatch.setattr(controller.cli, "load_pair", lambda name: (models, "tiny-draft"))
    monkeypatch.setattr(controller.costs, "measure", lambda lm, refresh=True: _FakeCurve())
    seen = {}

    def run_suite(methods, *args, **kwargs):
        seen["keys"] = [m.key for m in methods]
        return []

    monkeypatch.setattr(controller, "run_suite", run_suite)
    monkeypatch.setattr(controller, "rows", lambda records, methods: [])
    monkeypatch.setattr(controller, "markdown", lambda result: "")
    controller.main(["--no-tune", "--methods", "ours/chain-cost,ours/static-4", "--temperatures", "0,1",
                     "--out", str(tmp_path / "c")])
    assert seen["keys"] == ["ours/baseline", "ours/chain-cost", "ours/static-4", "ours/baseline@t1",
                            "ours/chain-cost@t1", "ours/static-4@t1"]


class _FakeCurve:
    def to_dict(self):
        return {}
