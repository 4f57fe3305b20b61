"""bench/controller.py on tiny models: SpecLab's arms run, equal the baseline at T 0, and the table reports the
controller's caps next to the fixed presets (transformers' arms need real transformers weights: not run here)."""
from __future__ import annotations

import pytest

from bench import controller
from bench.runner import Prompt, run_suite

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


TUNED = {"num_assistant_tokens": 10, "assistant_confidence_threshold": 0.6,
         "num_assistant_tokens_schedule": "heuristic"}


def test_pair_arms_cover_the_issue_s_comparison_on_both_drafts():
    methods = controller.pair_methods({"int8": TUNED, "none": TUNED}, 0.0)
    keys = {m.key for m in methods}
    assert {"ours/eagle2-paper-int8", "hf/prompt-lookup", "hf/greedy", "ours/lookup-cost"} <= keys
    for tag in ("int8", "f32"):
        assert {f"ours/chain-cost-{tag}", f"ours/tree-cost-{tag}", f"ours/adaedl-8-{tag}", f"ours/static-4-{tag}",
                f"hf/assisted-defaults-{tag}", f"hf/assisted-tuned-{tag}"} <= keys
    # equal terms: every transformers assisted arm decodes with a draft precision a SpecLab arm also runs
    ours_quants = {m.draft_quant for m in methods if m.family == "ours" and m.needs_draft}
    hf_quants = {m.draft_quant for m in methods if m.key.startswith("hf/assisted")}
    assert ours_quants == hf_quants == {"int8", "none"}
    assert all(("int8 draft" in m.label) == (m.draft_quant == "int8") for m in methods if m.needs_draft)
    sampled = controller.pair_methods({}, 1.0)
    assert all(m.temperature == 1.0 for m in sampled) and all(m.key.endswith("@t1") for m in sampled)
    assert not any("assisted-tuned" in m.key for m in sampled)  # nothing tuned: no "tuned" arm


def test_speclab_arms_run_and_the_table_reads():
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(layers=4)  # its own models: the bench packs the models it runs (session ones stay stock)
    draft = noisy_copy(target, noise=0.02)
    methods = [m for m in controller.pair_methods({}, 0.0, ("none",)) if m.family == "ours"]
    prompts = [Prompt("a", "chat", "", [3, 9, 4, 1, 7]), Prompt("b", "code-writing", "", [10, 11, 12, 10, 11])]
    records = run_suite(methods, {"target": target, "draft": draft}, prompts, reps=1, max_new_tokens=12,
                        log=lambda *a: None, warmup=False)
    assert all(r["identical_to_baseline"] for r in records)
    assert {r["draft_precision"] for r in records if r["method"].startswith("ours/chain-cost")} == {"float32"}
    rows = controller.rows(records, [m.key for m in methods])
    chain = next(r for r in rows if r["method"] == "ours/chain-cost-f32" and r["kind"] == "all")
    assert chain["mean_cap"] is not None and chain["speedup"] is not None and chain["draft"] == "float32"
    assert chain["vs_hf_tuned"] is None  # transformers did not run here: no ratio, never one on another draft
    curve = {"model": "tiny", "step_seconds": 0.01, "chain": {"2": 1.1, "4": 1.2}}
    table = controller.markdown({"settings": {"target": "tiny", "draft": "tiny-draft", "machine": "test",
                                              "command": "x", "prompts": 2, "reps": 1, "max_new_tokens": 12,
                                              "threads": 1, "minutes": 0.0,
                                              "load": {"label": "quiet machine, load 0.50 per core"}},
                                 "costs": {"target": curve}, "rows": rows, "records": records,
                                 "assisted_tuned": {}})
    assert "cost-aware cap (controller); float32 draft | float32 |" in table and "t(2) 1.10" in table
    assert "| ours/static-4-f32 | chat | " in table  # the fixed chain's acceptance by depth
    assert "quiet machine, load 0.50 per core" in table
    assert "transformers' assisted generation: not run (this run's --methods left its arms out)." in table


def _timed(method: str, quant: str | None, tok_s: float, prompt: str = "p", family: str = "ours") -> dict:
    return {"method": method, "label": method, "family": family, "prompt": prompt, "prompt_kind": "chat", "rep": 0,
            "tok_s": tok_s, "tau": 2.0, "temperature": 0.0, "draft_quant": quant,
            "draft_precision": {"int8": "int8", "none": "float32"}.get(quant)}


def test_each_arm_is_set_beside_transformers_on_the_same_draft():
    """The int8 chain beside transformers' int8 arm, the float32 chain beside its float32 arm; an arm whose draft
    transformers did not run gets no ratio (the old table set every arm beside the float32 one: 2.05×)."""
    records = [_timed("ours/baseline", None, 1.0), _timed("ours/chain-cost-int8", "int8", 6.0),
               _timed("ours/chain-cost-f32", "none", 3.0), _timed("ours/chain-cost-auto", "auto", 6.0),
               _timed("hf/assisted-tuned-int8", "int8", 4.0, family="hf"),
               _timed("hf/assisted-tuned-f32", "none", 2.0, family="hf"),
               _timed("hf/assisted-defaults-f32", "none", 1.5, family="hf")]
    rows = {r["method"]: r for r in controller.rows(records) if r["kind"] == "all"}
    assert rows["ours/chain-cost-int8"]["vs_hf_tuned"] == pytest.approx(1.5)  # 6 ÷ 4, not 6 ÷ 2
    assert rows["ours/chain-cost-f32"]["vs_hf_tuned"] == pytest.approx(1.5)  # 3 ÷ 2
    assert rows["ours/chain-cost-int8"]["vs_hf_defaults"] is None  # no int8 defaults arm ran
    assert rows["ours/chain-cost-f32"]["vs_hf_defaults"] == pytest.approx(2.0)
    assert rows["ours/chain-cost-auto"]["vs_hf_tuned"] is None
    assert rows["ours/chain-cost-int8"]["draft"] == "int8" and rows["hf/assisted-tuned-f32"]["draft"] == "float32"


def test_the_committed_tables_say_tuned_only_where_transformers_was_tuned():
    """The SmolLM2 file (no draft model) and the focused re-run (--no-tune, transformers' arms left out) once said
    "HF assisted, tuned: 20 tokens, confidence 0.4, constant": transformers' defaults, and no assisted arm ran."""
    from bench.common import RESULTS

    smollm2 = (RESULTS / "controller-smollm2-135m.md").read_text()
    focused = (RESULTS / "controller-qwen2.5-coder-1.5b-focused.md").read_text()
    full = (RESULTS / "controller-qwen2.5-coder-1.5b.md").read_text()
    for text in (smollm2, focused, full):
        assert "HF assisted, tuned" not in text
    assert "transformers' assisted generation: not run (the target has no draft model in the registry)." in smollm2
    assert "transformers' assisted generation: not run (this run's --methods left its arms out)." in focused
    assert ("transformers' assisted generation, float32 draft: tuned on separate tuning prompts to 5 tokens, "
            "confidence 0.2, heuristic") in full
    # the full run's like-for-like arm, float32 draft on both sides: 0.94× at T 0 and 0.93× at T 1
    line = next(line for line in full.splitlines() if line.startswith("| SpecLab draft model · AdaEDL · cost-aware "
                                                                      "cap, float32 draft | float32 (requested) |")
                and "| all | 0 |" in line)
    assert "| 0.94× | 0.94× |" in line
    # the tree ran the int8 draft ("auto" on this machine) and transformers the float32 one: no ratio (it read 2.05×)
    tree = next(line for line in full.splitlines() if line.startswith("| SpecLab EAGLE-2 tree · cost-aware") and
                "| all | 0 |" in line)
    assert "| 3.16× | – | – |" in tree


def test_no_tune_runs_transformers_at_its_defaults_only(monkeypatch, tmp_path):
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(layers=4)
    models = {"target": target, "draft": noisy_copy(target, noise=0.02)}
    monkeypatch.setattr(controller.cli, "load_pair", lambda name: (models, "tiny-draft"))
    monkeypatch.setattr(controller.costs, "measure", lambda lm, refresh=True: _FakeCurve())
    monkeypatch.setattr(controller, "tune_assisted", lambda *a, **k: pytest.fail("tuned with --no-tune"))
    seen = {}
    monkeypatch.setattr(controller, "run_suite", lambda methods, *a, **k: seen.setdefault("keys", [m.key for m in
                                                                                                  methods]) and [])
    monkeypatch.setattr(controller, "rows", lambda records, order: [])
    monkeypatch.setattr(controller, "markdown", lambda result: "")
    controller.main(["--no-tune", "--temperatures", "0", "--out", str(tmp_path / "c")])
    assert "hf/assisted-defaults-int8" in seen["keys"] and "hf/assisted-defaults-f32" in seen["keys"]
    assert not any("tuned" in key for key in seen["keys"])


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
    monkeypatch.setattr(controller, "rows", lambda records, order: [])
    monkeypatch.setattr(controller, "markdown", lambda result: "")
    controller.main(["--no-tune", "--methods", "ours/chain-cost,ours/static-4-f32", "--temperatures", "0,1",
                     "--out", str(tmp_path / "c")])
    assert seen["keys"] == ["ours/baseline", "ours/chain-cost-int8", "ours/chain-cost-f32", "ours/static-4-f32",
                            "ours/baseline@t1", "ours/chain-cost-int8@t1", "ours/chain-cost-f32@t1",
                            "ours/static-4-f32@t1"]


def test_the_equal_terms_rerun_tunes_transformers_on_each_draft(monkeypatch, tmp_path):
    """--methods equal-terms: the controller's chain and tree and transformers' assisted generation (defaults and
    tuned), each on the int8 and the float32 draft; transformers tuned once per draft, on that draft."""
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(layers=4)
    models = {"target": target, "draft": noisy_copy(target, noise=0.02)}
    monkeypatch.setattr(controller.cli, "load_pair", lambda name: (models, "tiny-draft"))
    monkeypatch.setattr(controller.costs, "measure", lambda lm, refresh=True: _FakeCurve())
    tuned_on = []

    def tune(models, args, quants, log):
        tuned_on.extend(quants)
        return {q: dict(TUNED, num_assistant_tokens=5 if q == "int8" else 10) for q in quants}

    monkeypatch.setattr(controller, "tune_assisted", tune)
    seen = {}
    monkeypatch.setattr(controller, "run_suite", lambda methods, *a, **k: seen.setdefault("methods", methods) and [])
    monkeypatch.setattr(controller, "rows", lambda records, order: [])
    monkeypatch.setattr(controller, "markdown", lambda result: "")
    controller.main(["--methods", "equal-terms", "--temperatures", "0,1", "--out", str(tmp_path / "c")])
    assert tuned_on == ["int8", "none"]
    keys = [m.key for m in seen["methods"] if m.temperature == 0]
    assert keys == ["ours/baseline", "ours/chain-cost-int8", "ours/tree-cost-int8", "hf/assisted-defaults-int8",
                    "hf/assisted-tuned-int8", "ours/chain-cost-f32", "ours/tree-cost-f32", "hf/assisted-defaults-f32",
                    "hf/assisted-tuned-f32"]
    tuned = {m.key: m for m in seen["methods"] if "tuned" in m.key and m.temperature == 0}
    assert tuned["hf/assisted-tuned-int8"].options["num_assistant_tokens"] == 5
    assert tuned["hf/assisted-tuned-int8"].draft_quant == "int8"
    assert tuned["hf/assisted-tuned-f32"].draft_quant == "none"


class _FakeCurve:
    def to_dict(self):
        return {}
