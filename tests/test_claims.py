"""The claims table is built from the results files: one headline row per claim (the designated run), the rest as
its history, one ratio wording, no machine paths; missing methods say so."""
from __future__ import annotations

import json
import re
from html import escape

import pytest

from app.figures.claims import CLAIMS_CSS
from app.tabs import claims as claims_tab
from bench import claims, leviathan, report
from bench.claim_measures import repo_command
from bench.claim_types import RATIO_WORDING
from bench.costs import alpha_from_tau, leviathan_speedup

PLD = {"key": "ours/prompt-lookup", "label": "SpecLab prompt lookup", "family": "ours", "kind": "prompt-lookup",
       "rule": "static", "gamma": 4, "options": {"ngram": 3}}
DRAFT = {"key": "ours/draft-model", "label": "SpecLab draft model", "family": "ours", "kind": "draft-model",
         "rule": "adaedl", "gamma": 4, "options": {}}
# per-round [drafted, accepted]: code editing copies long spans, chat almost nothing; the short rounds (fewer than
# γ = 4 drafts) must not count
ROUNDS = {"code-editing": [[4, 4], [4, 3], [2, 2], [0, 0]], "chat": [[4, 1], [4, 0], [1, 0], [0, 0]]}
BAD_PATHS = ("/work/", "/home/", "/root/", "../shared", ".venv/", "performance_anchors")


def _record(kind: str, rounds: list[list[int]], **extra) -> dict:
    tokens = sum(a + 1 for _, a in rounds)
    return {"method": PLD["key"], "prompt": f"{kind}-1", "prompt_kind": kind, "rep": 0, "rounds": rounds,
            "n_tokens": tokens, "trace_tau": tokens / len(rounds), "drafted": sum(d for d, _ in rounds),
            "accepted": sum(a for _, a in rounds), "temperature": 0.0, **extra}


def _row(method: str, kind: str, speedup: float) -> dict:
    return {"method": method, "label": method, "kind": kind, "speedup": speedup, "tau": 2.0}


def _speed_file(command: str = "/work/main/bench/__main__.py --pair --out /root/out") -> dict:
    meta = {"command": command, "machine": "Test CPU, 2 cores", "threads": 2, "torch": "9.9"}
    run = {"models": {"target": "big", "draft": "small"}, "methods": [PLD, DRAFT],
           "costs": {"target_curve": {"t": {"1": 1.0, "5": 2.0}}},
           "records": [_record(kind, rounds) for kind, rounds in ROUNDS.items()],
           "rows": [_row("ours/prompt-lookup", "code-editing", 3.0), _row("ours/prompt-lookup", "chat", 1.0),
                    _row("ours/draft-model", "code-editing", 1.8), _row("ours/draft-model", "chat", 1.2)]}
    return {"meta": meta, "runs": {"float32": run}}


@pytest.fixture()
def results(tmp_path):
    (tmp_path / "pair.json").write_text(json.dumps(_speed_file()))  # the stem the real headlines designate
    whisper = {"meta": {"machine": "Test CPU"}, "table": [
        {"model": "w", "decoder": "filter-ends+min-lookahead", "delta_vs_beam": -0.01},
        {"model": "w", "decoder": "filter-ends+min-lookahead", "delta_vs_beam": -0.03},
        {"model": "w", "decoder": "beam", "delta_vs_beam": 0.0}]}
    (tmp_path / "whisper.json").write_text(json.dumps(whisper))
    return tmp_path


def _row_for(table, method) -> claims.ClaimRow:
    (row,) = [row for row in table if row.claim.method == method]
    return row


def _expected_S(kind: str) -> float:
    full = [a for d, a in ROUNDS[kind] if d == 4]
    return leviathan_speedup(alpha_from_tau(sum(a + 1 for a in full) / len(full), 4), 4, 0.0)


# --- the headline table ---

def test_one_headline_per_claim_from_its_designated_run(results):
    table = claims.table(claims.load_results(results))
    assert [row.claim for row in table] == list(claims.CLAIMS)
    pld = _row_for(table, "prompt lookup (PLD)")
    assert pld.headline.source == "pair.json" and pld.headline.ours == 3.0  # code editing only
    assert pld.ratio()[0] == "1.50× the paper's 2–4×"  # 3.0 ÷ the bottom of the range
    assert pld.headline.command == "python -m bench --pair"  # machine paths gone
    assert "Test CPU" in pld.headline.hardware and pld.headline.setting == "big, float32"  # no draft: it drafts none
    sps = _row_for(table, "draft model (SpS)")
    assert sps.headline.ours == pytest.approx(1.5) and sps.headline.setting == "big + small draft, float32"
    whisper = _row_for(table, "Whisper Filter-Ends + Min Lookahead")
    assert whisper.headline.short == "−2.00 WER points vs beam search"
    assert whisper.ratio()[0] == "0.88× the paper's −2.26 WER points"


def test_the_history_holds_every_other_measurement(results):
    theory = _row_for(claims.table(claims.load_results(results)), "speculative sampling (theory)")
    assert theory.headline.key == "float32/ours/prompt-lookup/code-editing"
    assert [m.key for m in theory.history] == ["float32/ours/prompt-lookup/chat"]


def test_a_missing_designated_run_says_so_and_keeps_the_others(results):
    (results / "pair.json").rename(results / "pair-old.json")
    row = _row_for(claims.table(claims.load_results(results)), "prompt lookup (PLD)")
    assert row.headline is None
    assert row.note == "headline run missing: pair.json (float32); 1 other measurement(s) below"
    assert [m.source for m in row.history] == ["pair-old.json"]


def test_a_missing_results_file_gives_a_not_measured_row(results):
    (results / "whisper.json").unlink()
    table = claims.table(claims.load_results(results))
    whisper = _row_for(table, "Whisper Filter-Ends + Min Lookahead")
    assert whisper.headline is None and whisper.note.startswith("not measured") and whisper.history == []
    for method in ("EAGLE", "EAGLE-2 (dynamic trees)", "DDD (dynamic depth)", "DSBD (speculative beams)"):
        assert _row_for(table, method).note.startswith("not measured")
    future = claims.Claim("Lookahead", "Fu et al. 2024", "GPU", "1.8×", claims.Figure(1.8, "1.8×"), "n/a", "n/a",
                          lambda results: [], coming="Jacobi lookahead is not in SpecLab")
    (row,) = claims.table(claims.load_results(results), (future,))
    assert row.note == "coming: Jacobi lookahead is not in SpecLab" and row.headline is None


# --- Leviathan's theory rows: per prompt kind, from rounds that drafted γ tokens ---

def test_the_theory_rows_are_per_prompt_kind(results):
    theory = _row_for(claims.table(claims.load_results(results)), "speculative sampling (theory)")
    (chat,) = theory.history
    assert theory.headline.ours == 3.0 and chat.ours == 1.0  # each kind's own speed-up …
    assert theory.headline.figure.value == pytest.approx(_expected_S("code-editing"))  # … against its own S
    assert chat.figure.value == pytest.approx(_expected_S("chat"))
    assert theory.ratio()[0] == f"{3.0 / _expected_S('code-editing'):.2f}× the paper's S = " \
                                f"{_expected_S('code-editing'):.2f}×"
    assert "from the 2 of 4 rounds that drafted γ = 4 (per-round counts recorded)" in theory.headline.detail


def test_a_pooled_alpha_fails_the_per_kind_rows():
    """The old computation solved one α from τ pooled over every kind and every round: it gives both kinds the same
    S and counts the short rounds. The report's rows must carry each kind's own."""
    records = [_record(kind, rounds, tok_s=1.0, tau=1.0, acceptance_rate=0.5) for kind, rounds in ROUNDS.items()]
    rows = {row["kind"]: row for row in report.method_rows(records, [PLD], {})}
    pooled_tau = sorted(r["trace_tau"] for r in records)
    pooled = leviathan_speedup(alpha_from_tau(sum(pooled_tau) / 2, 4), 4, 0.0)
    for kind in ROUNDS:
        assert rows[kind]["S_leviathan"] == pytest.approx(_expected_S(kind))
        assert rows[kind]["S_leviathan"] != pytest.approx(pooled)
    assert rows["code-editing"]["theory"]["full_rounds"] == 2 and rows["code-editing"]["theory"]["rounds"] == 4


def test_rounds_with_fewer_than_gamma_drafts_do_not_count():
    # every full round accepted everything (α = 1); the no-match and short rounds would pull τ down
    runs = [_record("code-editing", [[4, 4], [0, 0], [1, 0], [4, 4], [2, 1]])]
    found = leviathan.theory(runs, PLD, {})
    assert found["alpha_from_tau"] == 1.0 and found["S_leviathan"] == 5.0
    assert alpha_from_tau(runs[0]["trace_tau"], 4) < 0.9  # what the run's own τ would have said


def test_without_per_round_counts_only_runs_that_always_drafted_gamma_count():
    full = {"method": PLD["key"], "prompt_kind": "chat", "n_tokens": 9, "trace_tau": 3.0, "drafted": 12,
            "accepted": 6}  # 3 rounds, 12 drafts = 4 each
    mixed = {**full, "drafted": 10}  # some round drafted fewer: which one is unknown
    found = leviathan.theory([full, mixed], PLD, {})
    assert found["full_rounds"] == 3 and found["runs_without_round_counts"] == 1
    assert found["alpha_from_tau"] == pytest.approx(alpha_from_tau(3.0, 4))
    none = leviathan.theory([mixed], PLD, {})
    assert none["alpha_from_tau"] is None and none["note"].startswith("α not solvable: 1 of 1 runs")
    older = {"target_forwards": 3, "n_tokens": 9, "drafted": 12, "accepted": 6}  # before trace_tau was kept
    assert leviathan.verification_rounds(older) == 3


def test_prompt_lookup_rounds_replay_from_the_output(tmp_path):
    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3]  # "1 2 3" occurs earlier, followed by 4 5 6 8
    output = [4, 5, 9, 8, 1]  # the target agrees with 4 5, then says 9; then nothing to copy, then no budget left
    rounds = [[4, 2], [0, 0], [0, 0]]
    assert leviathan.replay_prompt_lookup(prompt, output, 4, 3, 5, set()) == rounds
    data = _speed_file()
    run = data["runs"]["float32"]
    run["prompt_texts"] = {"code-editing-1": "p", "chat-1": "p"}
    data["meta"]["max_new_tokens"] = 5
    good = {k: v for k, v in _record("code-editing", rounds).items() if k != "rounds"}
    bad = {**good, "prompt": "chat-1", "accepted": 3}  # totals that this output cannot give
    run["records"] = [{**good, "output_ids": output, "prompt_tokens": len(prompt)},
                      {**bad, "output_ids": output, "prompt_tokens": len(prompt)}]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))

    class Encoder:
        def __call__(self, model, text):
            return prompt

        def eos_ids(self, model):
            return ()
    assert leviathan.replay_file(path, Encoder()) == {"replayed": 1, "kept": 0, "mismatch": 1}
    records = json.loads(path.read_text())["runs"]["float32"]["records"]
    assert records[0]["rounds"] == rounds and records[0]["rounds_source"] == leviathan.REPLAYED
    assert "rounds" not in records[1]


# --- the committed results and the page ---

def test_every_designated_headline_is_in_the_committed_results():
    table = claims.table(claims.load_results())
    missing = [(row.claim.method, row.note) for row in table if row.headline is None and not row.claim.coming]
    assert missing == [], "a claim's Headline(stem, key) in bench/claims.py names no measurement: update it"


def test_every_ratio_has_the_one_wording():
    rows = claims.table(claims.load_results())
    cells = [row.ratio()[0] for row in rows] + [row.ratio(m)[0] for row in rows for m in row.history if not m.note]
    assert cells and all(RATIO_WORDING.match(cell) for cell in cells), [c for c in cells if not RATIO_WORDING.match(c)]
    assert len({re.sub(r"[\d.−-]+", "N", c.split(" the paper's ")[0]) for c in cells}) == 1


def test_claims_md_is_current_and_opens_with_the_headline_table():
    text = claims.CLAIMS_MD.read_text()
    assert text == claims.markdown(claims.table(claims.load_results())), "run python -m bench.claims"
    first_table = text.split("\n\n| claim |", 1)[1].split("\n\n", 1)[0]
    assert first_table.count("\n| ") == len(claims.CLAIMS)  # one row per claim (after the separator)
    for bad in BAD_PATHS:
        assert bad not in text
    assert "performance_anchors" not in (claims.__doc__ or "")


def test_the_page_has_one_headline_row_per_claim_and_folds_the_rest():
    html = claims_tab.claims_page()
    headline = html.split('<table class="sl-claims-table sl-claims-headline">', 1)[1].split("</table>", 1)[0]
    assert headline.count("<tr>") == len(claims.CLAIMS) + 1  # the header and one row per claim
    assert html.count("<details>") == len(claims.CLAIMS)
    assert 'title=""' not in html and "href=" not in html
    for bad in BAD_PATHS:
        assert bad not in html
    assert 'class="sl-claims-command"' in html
    phone = CLAIMS_CSS.split("@media (max-width: 640px)", 1)[1]
    assert ".sl-claims-command { display: none" in phone and "display: block" in phone


def test_the_tab_and_the_markdown_show_the_same_measurements(results):
    table = claims.table(claims.load_results(results))
    html, text = claims_tab.claims_page(results), claims_tab.claims_markdown(results)
    html = re.sub(r"<[^>]+>", "", html)  # the words, without the markup
    assert text == claims.markdown(table)
    for row in table:
        if row.headline:
            assert escape(row.headline.short) in html and row.headline.short in text
            assert escape(row.ratio()[0]) in html and row.ratio()[0] in text


def test_commands_are_shown_relative_to_the_repository():
    assert repo_command("/work/main/bench/__main__.py --quick --out /root/out --stem q", "") == \
        "python -m bench --quick --stem q"
    assert repo_command("/home/u/.venv/bin/python3.11 -m bench.trees --out bench/results/t.json", "") == \
        "python -m bench.trees --out bench/results/t.json"
    unrecorded = "python -m bench.whisper (the file does not record its options)"
    assert repo_command(None, "python -m bench.whisper") == unrecorded


# --- the CLI and the benchmarks' own files ---

def test_the_cli_writes_the_markdown(results, tmp_path, capsys):
    out = tmp_path / "CLAIMS.md"
    claims.main(["--results", str(results), "--out", str(out)])
    text = out.read_text()
    for row in claims.table(claims.load_results(results)):  # every claim once, its headline or why not
        assert text.count(f"## {row.claim.method}\n") == 1
        assert (row.headline.short if row.headline else row.note) in text
    assert "wrote" in capsys.readouterr().out


def test_a_missing_results_folder_is_a_one_line_message(tmp_path):
    with pytest.raises(SystemExit, match="no results folder"):
        claims.main(["--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.md")])


def test_an_unreadable_file_is_skipped(results):
    (results / "broken.json").write_text("{not json")
    assert "broken" not in claims.load_results(results)


def test_the_benchmark_report_rewrites_claims_only_for_the_real_results_folder(results, monkeypatch, tmp_path):
    written = []
    monkeypatch.setattr(claims, "write", lambda directory: written.append(directory) or tmp_path / "CLAIMS.md")
    monkeypatch.setattr(report, "markdown", lambda result: "table")
    monkeypatch.setattr(report, "chart", lambda result, path: str(path))
    assert "claims" not in report.write({}, tmp_path / "elsewhere", "x")  # a test's scratch folder: no rewrite
    monkeypatch.setattr(report, "RESULTS", results.resolve())
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
    table = claims.table(claims.load_results(results))
    eagle2 = _row_for(table, "EAGLE-2 (dynamic trees)")
    assert eagle2.headline.key == "ours/eagle2-paper" and eagle2.headline.short == "0.61× over our greedy baseline"
    assert [m.key for m in eagle2.history] == ["ours/eagle2-cpu"]
    ddd = _row_for(table, "DDD (dynamic depth)")
    assert ddd.headline.source == "trees-smollm2-135m.json" and ddd.ratio()[0] == "0.21× the paper's 3.16×"


def _arm(key, width, tps, kv, logp, passed):
    return {"arm": key, "key": key, "width": width, "tokens_per_second": tps, "peak_kv_bytes": kv,
            "mean_logprob": logp, "pass_at_1": passed}


def test_dsbd_is_measured_against_beam_sampling_at_its_own_width(results):
    summary = [_arm("dsbd", 4, 6.0, 4000, -0.31, 0.5), _arm("beam-sampling-2", 2, 9.0, 2000, -0.3, 0.5),
               _arm("beam-sampling-4", 4, 4.0, 4000, -0.29, 0.4), _arm("speculative", None, 8.0, 1000, -0.4, 0.3)]
    meta = {"command": "python -m bench.beams --problems 4", "machine": "Test CPU", "threads": 2, "dtype": "float32"}
    data = {"target": "big", "draft": "small", "problems": 4, "max_new_tokens": 64, "meta": meta, "summary": summary}
    (results / "beams.json").write_text(json.dumps(data))
    dsbd = _row_for(claims.table(claims.load_results(results)), "DSBD (speculative beams)").headline
    assert dsbd.short == "DSBD 1.50× beam sampling's tokens/s at width 4"  # 6 / 4, not 6 / 9 (width 2)
    assert "mean log p -0.31 vs -0.29" in dsbd.detail and "pass@1 0.50 vs 0.40" in dsbd.detail
    assert "peak KV 4.0× speculative sampling's" in dsbd.detail and dsbd.command == meta["command"]
    # a file with runs paired by problem and seed: their median, not the ratio of totals
    data["paired"] = [{"metric": "tokens_per_second", "arm": "dsbd", "against": "beam-sampling-4", "n": 8,
                       "median": 1.2}]
    (results / "beams.json").write_text(json.dumps(data))
    dsbd = _row_for(claims.table(claims.load_results(results)), "DSBD (speculative beams)")
    assert dsbd.headline.ours == 1.2 and dsbd.ratio()[0] == "0.80× the paper's 1.5–1.9×"
    assert "median of 8 runs paired by problem and seed" in dsbd.headline.detail


def test_the_runner_records_rounds_and_the_replay_recomputes_them(tiny):
    """A real prompt lookup run (tiny float32 model, greedy): the runner's per-round counts add up to its totals, and
    replaying the drafter over the recorded output gives the same rounds, so replayed files are exact."""
    from bench.runner import Prompt, ours, run_one

    repeat = [5, 6, 7, 8, 9, 10, 11, 12]
    prompt = Prompt("p", "code-editing", "", ids=repeat * 3 + [5, 6])
    for gamma in (3, 6):
        method = ours("ours/pl", "pl", "prompt-lookup", gamma=gamma)
        record = run_one(method, {"target": tiny}, prompt, 24)
        rounds = record["rounds"]
        assert sum(d for d, _ in rounds) == record["drafted"] and sum(a for _, a in rounds) == record["accepted"]
        assert len(rounds) == leviathan.verification_rounds(record)
        assert any(d < gamma for d, _ in rounds)  # the budget cuts the last rounds short: they must not count
        replayed = leviathan.replay_prompt_lookup(prompt.ids, record["output_ids"], gamma, 3, 24, set())
        assert replayed == rounds


# --- issue 33 item 7 and item 3's claims half: each statement checked against its results file ---

def _committed_row(method: str) -> claims.ClaimRow:
    return _row_for(claims.table(claims.load_results()), method)


def test_the_whisper_lora_claim_says_what_its_results_file_measured():
    from bench.common import RESULTS

    row = _committed_row("Whisper LoRA fine-tuning (Vietnamese)")
    data = json.loads((RESULTS / "whisper-finetune.json").read_text())
    wer = {r["arm"]: 100 * r["wer"] for r in data["results"]}
    assert row.headline.source == "whisper-finetune.json" and row.headline.key == "lora-vs-full"
    assert row.headline.ours == pytest.approx(wer["lora"] - wer["full"])  # −8.06 points
    assert row.headline.short == f"LoRA −{wer['full'] - wer['lora']:.2f} WER points vs full fine-tuning"
    assert row.ratio()[0] == f"{(wer['lora'] - wer['full']) / -1.45:.2f}× the paper's −1.45 WER points"
    # small and lopsided, said where the number is: 62 syllables, and one clip carries most of zero-shot's errors
    assert "62 held-out syllables (one syllable = 1.6 points)" in row.headline.detail
    assert "zero-shot made 47 of its 88 errors on \"Cà phê ở đây rất ngon.\"" in row.headline.detail
    assert "without that clip: zero-shot 73.21%, full 73.21%, lora 64.29%" in row.headline.detail
    history = {(m.source, m.key): m for m in row.history}
    assert history[("whisper-finetune.json", "lora-vs-zero-shot")].ours == pytest.approx(wer["lora"] - wer["zero-shot"])
    assert history[("whisper-finetune-seed1.json", "lora-vs-full")].short == \
        "LoRA −3.23 WER points vs full fine-tuning"
    peft = history[("whisper-finetune-peft.json", "lora")]  # the LoRA arm alone: nothing in its run to compare with
    assert peft.ours is None and peft.note and row.ratio(peft)[0] == "–"
    assert "## Whisper LoRA fine-tuning (Vietnamese)" in claims.CLAIMS_MD.read_text()


def test_the_batch_headline_is_end_to_end_on_a_run_whose_rows_went_ragged():
    from bench.common import RESULTS

    row = _committed_row("batched speculative decoding (ragged rows)")
    data = json.loads((RESULTS / "batch-qwen2.5-coder-1.5b.json").read_text())
    cell = {(r["method"], r["set"], r["batch"]): r for r in data["rows"]}
    e2e = {key: r["e2e_tokens_per_second"] for key, r in cell.items()}
    assert row.headline.source == "batch-qwen2.5-coder-1.5b.json" and row.headline.key == "draft-model/chat"
    assert row.headline.ours == pytest.approx(e2e[("draft-model", "chat", 8)] / e2e[("draft-model", "chat", 1)])
    over_base = e2e[("draft-model", "chat", 8)] / e2e[("baseline", "chat", 8)]
    assert row.headline.short.startswith(f"{over_base:.2f}× the batched baseline at B = 8, end to end")
    taus = cell[("draft-model", "chat", 8)]["tau"]
    assert min(taus) < max(taus) and f"rows ragged: τ per row {min(taus):.2f}–{max(taus):.2f}" in row.headline.detail
    decode_only = cell[("draft-model", "chat", 8)]["over_batch_1"]
    assert f"decode-only (prefill left out): {decode_only:.2f}× its batch-1 tokens/s" in row.headline.detail
    code = next(m for m in row.history if m.key == "draft-model/code-editing" and m.source == row.headline.source)
    assert "never ragged: every row τ 4.80" in code.detail and code.ours == pytest.approx(
        e2e[("draft-model", "code-editing", 8)] / e2e[("draft-model", "code-editing", 1)])  # 0.72, not 3.47
    # the decode-only 3.47× appears only under its label
    text = claims.CLAIMS_MD.read_text()
    spots = [m.start() for m in re.finditer(r"3\.47×", text)]
    assert spots and all("decode-only" in text[max(0, i - 120):i].lower() for i in spots)


def test_machine_labels_come_from_a_measured_load(results):
    from bench.common import LoadMeter, load_label, load_summary

    assert load_summary([]) == {"per_core": None, "samples": 0, "label": "machine load not measured"}
    assert load_label({"min": 0.4, "median": 0.9, "max": 1.1}).startswith("quiet machine, load 0.90 per core")
    assert load_label({"min": 0.9, "median": 3.2, "max": 4.0}).startswith("shared machine, load 3.20 per core")
    with LoadMeter(every=0.01) as meter:
        pass
    assert meter.summary()["samples"] >= 2 and meter.summary()["label"] != "machine load not measured"
    data = json.loads((results / "pair.json").read_text())
    data["meta"]["load"] = {"label": "shared machine, load 3.20 per core (median; 0.90–4.00)"}
    (results / "pair.json").write_text(json.dumps(data))
    sps = _row_for(claims.table(claims.load_results(results)), "draft model (SpS)")
    assert sps.headline.hardware == "Test CPU, 2 cores, 2 threads, shared machine, load 3.20 per core (median; " \
                                    "0.90–4.00)"


def test_no_results_file_labels_its_machine_by_a_constant_or_carries_a_local_lock():
    """"shared CPU" was printed into every self-drafters file whatever the load; race-defaults.md kept the machine
    lock around its command. A label now comes from bench/common.py's LoadMeter, a command from the process."""
    from bench.common import RESULTS

    texts = {path.name: path.read_text() for path in sorted(RESULTS.iterdir()) if path.suffix in (".md", ".json")}
    assert [name for name, text in texts.items() if "shared CPU" in text] == []
    assert [name for name, text in texts.items() if "flock" in text or "speclab-heavy.lock" in text] == []
    # the self-drafters file says what the load meter saw (or that its run predates it), never a constant
    assert re.search(r"load \d\.\d\d per core \(median|machine load not recorded",
                     texts["self-drafters-smollm2-135m.md"])
