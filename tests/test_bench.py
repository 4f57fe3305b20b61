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
    target.context_length = 512
    draft = noisy_copy(target, noise=0.02)
    draft.context_length = 512
    return lambda name, dtype: draft if "0.5b" in name else target


def test_pair_preset_end_to_end_on_tiny_models(tmp_path, tiny_loader, capsys):
    result = main(["--pair", "--dtypes", "float32", "--reps", "2", "--max-new-tokens", "12", "--per-kind", "1",
                   "--sweep-reps", "1", "--out", str(tmp_path), "--stem", "tiny"], loader=tiny_loader)
    printed = capsys.readouterr().out
    run = result["runs"]["float32"]
    keys = {r["method"] for r in run["records"]}
    assert {"ours/baseline", "ours/draft-model", "ours/prompt-lookup", "hf/greedy", "hf/assisted",
            "hf/prompt-lookup", "ours/t1/adaedl", "ours/t1/static-g8"} <= keys
    for r in run["records"]:
        if r["temperature"] == 0.0:  # float32 greedy: every method, ours and HF's, gives the baseline's tokens
            assert r["identical_to_baseline"], (r["method"], r["prompt"])
        assert r["tok_s"] is None or r["tok_s"] > 0
    assert {t["target"].split(" ")[0] for t in run["targets"]} >= {"draft", "prompt", "trace", "AdaEDL"}
    assert set(run["costs"]["target_curve"]["t"]) >= {"1", "64"} and run["costs"]["draft"]["c"] > 0
    assert run["costs"]["target_curve_stock"]["t"]["1"] == 1.0 and run["costs"]["draft_stock"]["c"] > 0
    assert {"ours/baseline@stock", "hf/assisted@packed"} <= keys  # the kernel controls ran
    assert "stock PyTorch kernels" in printed and "(control) draft model ÷ HF assisted" in printed
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["peer_settings"]["hf/assisted"]["num_assistant_tokens"] == 20
    assert (tmp_path / "tiny.md").read_text() in printed
    assert (tmp_path / "tiny.png").stat().st_size > 1000
    assert "| SpecLab draft model" in printed and "## Targets" in printed


def test_chart_falls_back_to_pillow(tmp_path):
    result = {"runs": {"float32": {"models": {"target": "t"}, "rows": [
        {"method": "ours/x", "label": "speculative x", "kind": "chat", "speedup": 1.5}]}}}
    assert report._chart_pil(result, tmp_path / "c.png") == "pillow"
    assert (tmp_path / "c.png").stat().st_size > 100


def test_report_only_rebuilds_from_saved_json(tmp_path, tiny_loader):
    main(["--pair", "--dtypes", "float32", "--reps", "1", "--max-new-tokens", "6", "--per-kind", "1",
          "--kinds", "code-editing", "--no-sweep", "--no-costs", "--out", str(tmp_path), "--stem", "a"],
         loader=tiny_loader)
    assert not (tmp_path / "a.partial.json").exists()  # removed once the full result is written
    rebuilt = main(["--report-only", str(tmp_path / "a.json"), "--out", str(tmp_path), "--stem", "b"])
    assert (tmp_path / "b.md").read_text() == (tmp_path / "a.md").read_text()
    assert rebuilt["runs"]["float32"]["targets"]
