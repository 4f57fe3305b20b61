"""The claims table is built from the results files: numbers come from them, missing methods say so."""
from __future__ import annotations

import json

import pytest

from app.tabs import claims as claims_tab
from bench import claims


def _speed_file(rows: list[dict], command: str = "python -m bench --quick") -> dict:
    meta = {"command": command, "machine": "Test CPU, 2 cores", "threads": 2, "torch": "9.9"}
    return {"meta": meta, "runs": {"float32": {"rows": rows}}}


def _row(method: str, kind: str, speedup: float, **extra) -> dict:
    return {"method": method, "label": method, "kind": kind, "speedup": speedup, "tau": 2.0, **extra}


@pytest.fixture()
def results(tmp_path):
    quick = _speed_file([
        _row("ours/prompt-lookup", "code-editing", 3.0, S_leviathan=2.0, S_with_t=1.5),
        _row("ours/prompt-lookup", "chat", 1.0, S_leviathan=2.0, S_with_t=1.5),
        _row("ours/t1/static-g2", "code-writing", 1.2), _row("ours/t1/static-g4", "code-writing", 1.25),
        _row("ours/t1/adaedl", "code-writing", 1.5),
    ])
    (tmp_path / "quick.json").write_text(json.dumps(quick))
    whisper = {"meta": {"machine": "Test CPU"}, "table": [
        {"decoder": "filter-ends+min-lookahead", "delta_vs_beam": -0.01},
        {"decoder": "filter-ends+min-lookahead", "delta_vs_beam": -0.03}, {"decoder": "beam", "delta_vs_beam": 0.0}]}
    (tmp_path / "whisper.json").write_text(json.dumps(whisper))
    return tmp_path


def _rows_for(table, method):
    return [row for row in table if row.claim.method == method]


def test_numbers_come_from_the_results_files(results):
    table = claims.rows(claims.load_results(results))
    (leviathan,) = _rows_for(table, "speculative sampling (theory)")
    assert "measured 2.00×, S predicts 2.00×" in leviathan.measurement.value  # median of 3.0 and 1.0
    assert leviathan.measurement.ratio == "1.00 of S"
    assert leviathan.measurement.command == "python -m bench --quick"
    assert "Test CPU" in leviathan.measurement.hardware
    (pld,) = _rows_for(table, "prompt lookup (PLD)")
    assert "3.00×" in pld.measurement.value and "inside the claimed 2–4×" in pld.measurement.ratio
    (ada,) = _rows_for(table, "AdaEDL (entropy stop)")
    assert ada.measurement.value.startswith("AdaEDL 1.20× the best static γ")  # 1.5 / max(1.2, 1.25)
    (whisper,) = _rows_for(table, "Whisper Filter-Ends + Min Lookahead")
    assert whisper.measurement.value.startswith("filter-ends+min-lookahead: -2.00 WER points")


def test_a_missing_results_file_gives_a_not_measured_row(results):
    (results / "whisper.json").unlink()
    table = claims.rows(claims.load_results(results))
    (whisper,) = _rows_for(table, "Whisper Filter-Ends + Min Lookahead")
    assert whisper.measurement is None and whisper.note.startswith("not measured")
    (draft,) = _rows_for(table, "draft model (SpS)")  # no draft-model rows in the fixture
    assert draft.note.startswith("not measured")


def test_methods_that_have_not_landed_say_coming(results):
    table = claims.rows(claims.load_results(results))
    for method in ("EAGLE", "EAGLE-2 (dynamic trees)", "DDD (dynamic depth)"):  # landed, no results rows yet
        (row,) = _rows_for(table, method)
        assert row.note.startswith("not measured")
    future = claims.Claim("Lookahead", "Fu et al. 2024", "GPU", "1.8x", "n/a", lambda results: [],
                          coming="Jacobi lookahead is not in SpecLab")
    (row,) = claims.rows(claims.load_results(results), (future,))
    assert row.note == "coming: Jacobi lookahead is not in SpecLab" and row.measurement is None


def test_every_claim_names_its_source():
    for claim in claims.CLAIMS:
        assert claim.paper and claim.setting and claim.claim and claim.why


def test_the_cli_writes_the_markdown(results, tmp_path, capsys):
    out = tmp_path / "CLAIMS.md"
    claims.main(["--results", str(results), "--out", str(out)])
    text = out.read_text()
    table = claims.rows(claims.load_results(results))
    for row in table:  # every claim once, every measurement on its own line, every gap said
        assert text.count(f"## {row.claim.method}\n") == 1
        assert (row.measurement.value if row.measurement else row.note) in text
    assert "3.00×" in text and "not measured" in text
    assert "wrote" in capsys.readouterr().out


def test_a_missing_results_folder_is_a_one_line_message(tmp_path):
    with pytest.raises(SystemExit, match="no results folder"):
        claims.main(["--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.md")])


def test_an_unreadable_file_is_skipped(results):
    (results / "broken.json").write_text("{not json")
    assert "broken" not in claims.load_results(results)


def test_the_tab_shows_the_same_table(results):
    text = claims_tab.claims_markdown(results)
    assert text == claims.markdown(claims.rows(claims.load_results(results)))



def test_the_benchmark_report_rewrites_claims_only_for_the_real_results_folder(results, monkeypatch, tmp_path):
    from bench import report

    written = []
    monkeypatch.setattr(claims, "write", lambda directory: written.append(directory) or tmp_path / "CLAIMS.md")
    monkeypatch.setattr(report, "markdown", lambda result: "table")
    monkeypatch.setattr(report, "chart", lambda result, path: str(path))
    assert "claims" not in report.write({}, tmp_path / "elsewhere", "x")  # a test's scratch folder: no rewrite
    monkeypatch.setattr(claims, "RESULTS", results.resolve())
    assert report.write({}, results, "x")["claims"] == tmp_path / "CLAIMS.md"
    assert written == [results]


def test_the_tree_bench_fills_the_eagle2_and_ddd_rows(results):
    (results / "trees-smollm2-135m.json").write_text(json.dumps({
        "settings": {"target": "smollm2-135m", "dtype": "float32", "prompts": 6, "reps": 2, "threads": 2,
                     "machine": "x86_64 · torch 2.x", "command": "python -m bench.trees"},
        "rows": [{"method": "ours/baseline", "label": "baseline", "speedup": None, "tau": 1.0},
                 {"method": "ours/eagle2-paper", "label": "EAGLE-2 paper", "speedup": 0.61, "tau": 2.1},
                 {"method": "ours/eagle2-cpu", "label": "EAGLE-2 cpu", "speedup": 0.93, "tau": 1.8},
                 {"method": "ours/ddd-paper", "label": "DDD paper", "speedup": 0.66, "tau": 1.9}]}))
    table = claims.rows(claims.load_results(results))
    eagle2 = [r.measurement.value for r in _rows_for(table, "EAGLE-2 (dynamic trees)")]
    assert eagle2 == ["EAGLE-2 paper on smollm2-135m: 0.61× over our baseline (float32; 6 prompts × 2 reps, τ 2.10)",
                      "EAGLE-2 cpu on smollm2-135m: 0.93× over our baseline (float32; 6 prompts × 2 reps, τ 1.80)"]
    (ddd,) = _rows_for(table, "DDD (dynamic depth)")
    assert ddd.measurement.source == "trees-smollm2-135m.json" and "0.21 of the claim" in ddd.measurement.ratio


def test_dsbd_is_measured_against_beam_sampling_at_its_own_width(results):
    (dsbd,) = _rows_for(claims.rows(claims.load_results(results)), "DSBD (speculative beams)")
    assert dsbd.note.startswith("not measured")  # no bench.beams file yet

    def arm(key, width, tps, kv, logp, passed):
        return {"arm": key, "key": key, "width": width, "tokens_per_second": tps, "peak_kv_bytes": kv,
                "mean_logprob": logp, "pass_at_1": passed}
    summary = [arm("dsbd", 4, 6.0, 4000, -0.31, 0.5), arm("beam-sampling-2", 2, 9.0, 2000, -0.3, 0.5),
               arm("beam-sampling-4", 4, 4.0, 4000, -0.29, 0.4), arm("speculative", None, 8.0, 1000, -0.4, 0.3)]
    meta = {"command": "python -m bench.beams --problems 4", "machine": "Test CPU", "threads": 2, "dtype": "float32"}
    (results / "beams.json").write_text(json.dumps({"target": "big", "draft": "small", "problems": 4,
                                                    "max_new_tokens": 64, "meta": meta, "summary": summary}))
    (dsbd,) = _rows_for(claims.rows(claims.load_results(results)), "DSBD (speculative beams)")
    value = dsbd.measurement.value
    assert value.startswith("DSBD 1.50× beam sampling at width 4 on big + small")  # 6 / 4, not 6 / 9 (width 2)
    assert "mean log p -0.31 vs -0.29" in value and "pass@1 0.50 vs 0.40" in value
    assert "peak KV 4.0× speculative sampling's" in value
    assert dsbd.measurement.ratio == "1.50×: inside the claimed 1.5–1.9×"
    assert dsbd.measurement.command == "python -m bench.beams --problems 4" and "Test CPU" in dsbd.measurement.hardware
