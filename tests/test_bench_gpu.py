"""`python -m bench.gpu` (issue 32, part 4): the dry run of the whole pipeline on the CPU, its pieces on tiny models,
the page it writes, and how bench/gpu_ship.py cuts and sends the weights."""
from __future__ import annotations

import json

import pytest
import torch

from bench import gpu, gpu_arms, gpu_report, gpu_ship
from decoders import DecodeOptions, generate


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_writes_the_page(tmp_path):
    """SmolLM2 on the CPU, 1 prompt per code kind, 4 tokens: t(n) per path, the race and transformers' static cache
    all run, and every SpecLab output equals the baseline's. (The checks stage, a pytest run of its own, is left out
    here; test_the_checks_stage_runs_pytest_and_keeps_its_log runs it.)"""
    stem = tmp_path / "gpu-dry-run"
    assert gpu.main(["--dry-run", "--skip-checks", "--max-new-tokens", "4", "--out", str(stem)]) == 0
    result = json.loads(stem.with_suffix(".json").read_text())
    assert set(result["stages"]) == {"load", "steps", "race", "hf-static"}
    assert not [name for name, stage in result["stages"].items() if "error" in stage]
    assert set(result["stages"]["steps"]["curves"]) == {"dynamic", "fixed"}
    records = result["stages"]["race"]["records"]
    ours = [r for r in records if r["method"].startswith("ours/")]
    assert ours and all(r["identical_to_baseline"] for r in ours)
    assert {r["method"] for r in records} >= {"ours/baseline", "ours/baseline-dynamic", "ours/eagle2-cost", "hf/greedy"}
    page = stem.with_suffix(".md").read_text()
    assert "DRY RUN on the CPU" in page and "## Issue 32's targets" in page and "(dry run: not a result)" in page


def test_the_checks_stage_runs_pytest_and_keeps_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "CHECKS_DRY", ["tests/test_graphs.py", "-k", "smallest_bucket"])
    checks = gpu.run_checks(False, tmp_path / "gpu-x", timeout=300)
    assert checks["returncode"] == 0 and checks["summary"] and "1 passed" in checks["summary"][-1]
    assert "1 passed" in (tmp_path / "gpu-x-pytest.log").read_text() and "tests/test_graphs.py" in checks["command"]


def test_t_of_n_is_timed_for_each_path(tiny):
    for path in ("dynamic", "fixed"):
        curve = gpu_arms.time_widths(tiny.model, path, widths=(1, 2, 4), repeats=1, context=8)
        assert curve["t"][1] == 1.0 and set(curve["seconds"]) == {1, 2, 4} and curve["path"] == path
    tree = gpu_arms.time_widths(tiny.model, "fixed", widths=(1, 3), repeats=1, context=8, tree=True)
    assert tree["tree"] and tree["t"][1] == 1.0


def test_transformers_static_cache_arm_decodes_greedy_or_reports_its_error(tiny, monkeypatch):
    ours = generate(DecodeOptions(max_new_tokens=6), [3, 9, 4, 1], target=tiny).output_ids
    run = gpu_arms.run_hf_static("hf/greedy-static", tiny, [3, 9, 4, 1], 6)
    assert run["output_ids"] == ours and run["tok_s"] > 0

    def broken(**kwargs):
        raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten")

    monkeypatch.setattr(tiny.model, "generate", broken)
    failed = gpu_arms.run_hf_static("hf/greedy-static-compiled", tiny, [3, 9, 4, 1], 6)
    assert failed == {"method": "hf/greedy-static-compiled",
                      "error": "RuntimeError: accessing tensor output of CUDAGraphs that has been overwritten"}


def test_the_page_marks_each_target_met_missed_or_not_measured():
    def record(method, prompt, tok_s, same=True):
        return {"method": method, "prompt": prompt, "prompt_kind": "code-writing", "rep": 0, "tok_s": tok_s,
                "tau": 1.0, "identical_to_baseline": same, "controller_caps": [4, 8]}

    methods = [{"key": k, "label": k, "options": {}} for k in ("ours/baseline", "ours/eagle2-cost", "hf/greedy")]
    records = [record("ours/baseline", "p", 350.0), record("ours/eagle2-cost", "p", 700.0), record("hf/greedy", "p", 30.0)]
    result = {"meta": {"device": "NVIDIA H100", "dry_run": False, "command": "python -m bench.gpu", "target": "smollm2",
                       "dtype": "float32", "torch": "2.11", "transformers": "5.23", "commit": "abc", "date": "d",
                       "minutes": 7.0},
              "stages": {"race": {"methods": methods, "records": records, "prompts": ["p"],
                                  "caps": {"ours/eagle2-cost": gpu_arms.caps(records, "ours/eagle2-cost")}}}}
    page = gpu_report.markdown(result)
    assert "| graph baseline ≥ 300 tok/s | 350.0 tok/s | met |" in page
    assert "| best speculative ≥ 2.5× the graph baseline | 2.00× (ours/eagle2-cost) | missed |" in page
    assert "| t(64)/t(1) ≤ 1.5 with graphs | – | not measured |" in page
    assert "| 6 (4–8) |" in page  # the controller's caps, median (range)


def test_the_weights_travel_in_parts_that_join_to_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_ship, "SHIP", tmp_path / "ship")
    original = tmp_path / "model.gguf"
    original.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    parts = gpu_ship.split(original, [4000, 4000, 4000])
    assert [p.stat().st_size for p in parts] == [4000, 4000, 2240]
    assert b"".join(p.read_bytes() for p in parts) == original.read_bytes()
    command = gpu_ship.run_command("ab" * 32)
    assert len(command) < 2000  # the device tool's limit on a command
    assert "sha256sum -c" in command and "python3 -m bench.gpu" in command and "$OUT" in command


def test_the_trim_levels_keep_what_the_run_needs():
    """The run call keeps SmolLM2's drafter weights and the bench prompts; the ship calls send almost nothing."""
    kept = [d for d in ("assets/eagle", "assets/early-exit", "assets/prophet", "assets/bench", "decoders", "tests")
            if any(d == x or d.startswith(x + "/") for x in gpu_ship.LEVELS["run"])]
    assert kept == []
    assert gpu_ship.level_bytes("ship") < 8 * 2 ** 20 < gpu_ship.level_bytes("run") < gpu_ship.LIMIT - 12 * 2 ** 20
