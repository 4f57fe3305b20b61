"""What bench/claims.py reads from the results files: one Measurement per comparable figure, and its ratio to the
paper's figure in the one wording every row uses ("0.58× the paper's 2–2.5×").

A measure is a function results -> [Measurement]; each measurement has a `key` unique within its results file, so a
claim can name its headline run as (file stem, key).
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import leviathan

RESULTS = Path(__file__).resolve().parent / "results"
NOREC = ":norec"  # a method's recording-off twin: it measures the trace's cost, not the method

Results = dict[str, dict]  # file stem -> parsed results JSON


@dataclass(frozen=True)
class Figure:
    """A paper's number as something to divide by: `value` is the number, or the bottom of a range."""
    value: float
    text: str  # as the paper states it, e.g. "2–2.5×", "−2.26 WER points"
    is_range: bool = False


@dataclass(frozen=True)
class Measurement:
    """One measured counterpart to a claim, read from one results file."""
    key: str  # unique within its file: what a claim's headline designation names
    ours: float | None  # the number set against the paper's figure
    short: str  # that number in words, e.g. "1.69× over our greedy baseline"
    detail: str  # what else the run measured (kinds, τ, α …)
    setting: str  # models and number format
    hardware: str
    command: str  # relative to the repository root
    source: str  # the results file, e.g. "pair.json"
    figure: Figure | None = None  # replaces the claim's figure (Leviathan: S at this run's α, γ, c)
    note: str = ""  # why there is no ratio, when there is none


RATIO_WORDING = re.compile(r"^-?\d+\.\d\d× the paper's \S.*$")  # tests hold every ratio cell to this


def ratio(ours: float | None, figure: Figure) -> tuple[str, str]:
    """(cell text, hover text): ours ÷ the paper's figure (the bottom of a range), in the one wording."""
    if ours is None or not figure.value:
        return "–", "no number to compare"
    value = ours / figure.value
    what = f"the bottom of the paper's {figure.text}" if figure.is_range else f"the paper's {figure.text}"
    return (f"{value:.2f}× the paper's {figure.text}",
            f"ours {ours:.2f} ÷ {figure.value:g} ({what}) = {value:.2f}; 1.00 would equal the paper's figure")


# --- reading results files -----------------------------------------------------------------------------------------

def load_results(directory: Path = RESULTS) -> Results:
    """Every *.json in directory; an unreadable file is skipped (its claims then read "not measured")."""
    out: Results = {}
    for path in sorted(Path(directory).glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return out


_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:\\)")


def repo_command(command: str | None, default: str) -> str:
    """The command as run from the repository root: `…/bench/__main__.py` → `python -m bench`, an interpreter path →
    `python`, `--out /somewhere` dropped (the default folder is bench/results/), other machine paths cut to the part
    inside the repository or to their file name."""
    if not command:  # an older file that kept no command: say so rather than pass the default off as it
        return f"{default} (the file does not record its options)"
    words, out = command.split(), []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word == "--out" and i + 1 < len(words) and _ABSOLUTE.match(words[i + 1]) and "/bench/" not in words[i + 1]:
            skip = True
            continue
        if not _ABSOLUTE.match(word):
            out.append(word)
        elif word.endswith("/bench/__main__.py"):
            out += ["python", "-m", "bench"]
        elif re.search(r"/python[\d.]*$", word):
            out.append("python")
        elif "/bench/" in word:
            out.append("bench/" + word.split("/bench/", 1)[1])
        else:
            out.append(word.rsplit("/", 1)[-1])
    return " ".join(out)


def _hardware(meta: dict) -> str:
    parts = [meta.get("machine") or "unknown machine", f"{meta.get('threads')} threads" if meta.get("threads") else ""]
    return ", ".join(p for p in parts if p)


def _models(run: dict, rows: list[dict] = ()) -> str:
    """The target, and the draft model where one of `rows`' methods drafts with it."""
    models = run.get("models") or {}
    kinds = {m["key"]: m.get("kind") for m in run.get("methods") or []}
    drafts = not rows or any(kinds.get(row["method"], "draft-model") == "draft-model" for row in rows)
    return models.get("target", "?") + (f" + {models['draft']} draft" if models.get("draft") and drafts else "")


def _speed_runs(results: Results):
    """(stem, dtype, meta, run) for every run of every speed benchmark file (python -m bench); the run carries its
    method descriptions (older files keep them once for the whole file)."""
    for stem, data in sorted(results.items()):
        for dtype, run in (data.get("runs") or {}).items():
            methods = run.get("methods") or data.get("methods") or []
            yield stem, dtype, data.get("meta") or {}, {**run, "methods": methods}


def _picked(run: dict, wanted: Callable[[dict], bool]) -> list[dict]:
    return [row for row in run.get("rows") or [] if wanted(row) and row.get("speedup") is not None
            and not row["method"].endswith(NOREC)]


def _kinds(rows: list[dict]) -> str:
    return ", ".join(sorted({row["kind"] for row in rows}))


def method_is(*names: str) -> Callable[[dict], bool]:
    return lambda row: (row.get("method") or "").split("@")[0] in names


def method_mentions(word: str) -> Callable[[dict], bool]:
    return lambda row: word in (row.get("method") or "").lower()


# --- one measure per kind of claim ---------------------------------------------------------------------------------

def speedup_over_kinds(method: Callable[[dict], bool], label: str,
                       kinds: tuple[str, ...] | None = None) -> Callable[[Results], list[Measurement]]:
    """Median speed-up over prompt kinds of the rows `method` picks, one measurement per (file, dtype)."""
    def measure(results: Results) -> list[Measurement]:
        out = []
        for stem, dtype, meta, run in _speed_runs(results):
            rows = _picked(run, lambda r: method(r) and (kinds is None or r.get("kind") in kinds))
            if not rows:
                continue
            value = statistics.median(row["speedup"] for row in rows)
            taus = [row["tau"] for row in rows if row.get("tau")]
            tau = f"; τ {statistics.median(taus):.2f}" if taus else ""
            out.append(Measurement(dtype, value, f"{value:.2f}× over our greedy baseline",
                                   f"{label}; median over prompt kinds ({_kinds(rows)}){tau}",
                                   f"{_models(run, rows)}, {dtype}", _hardware(meta),
                                   repo_command(meta.get("command"), "python -m bench"), f"{stem}.json"))
        return out
    return measure


def leviathan_per_kind(results: Results) -> list[Measurement]:
    """Measured speed-up of a (method, prompt kind) against S(α, γ, c) with α solved for that kind alone, from the
    rounds that drafted γ tokens (bench/leviathan.py), recomputed from the run records."""
    out = []
    for stem, dtype, meta, run in _speed_runs(results):
        methods = {m["key"]: m for m in run["methods"]}
        # S needs the draft cost c: methods without a measured c have nothing to compare with
        for row in _picked(run, lambda r: leviathan.applies(methods.get(r["method"], {})) and
                           leviathan.draft_cost(methods[r["method"]], run.get("costs")) is not None):
            method = methods[row["method"]]
            runs = [r for r in run.get("records") or [] if r["method"] == row["method"]
                    and r["prompt_kind"] == row["kind"]]
            if not runs:
                continue
            found = leviathan.theory(runs, method, run.get("costs"))
            out.append(_leviathan_measurement(stem, dtype, meta, run, row, method, found))
    return out


def _leviathan_measurement(stem, dtype, meta, run, row, method, found) -> Measurement:
    gamma, S = found["gamma"], found["S_leviathan"]
    sources = {"recorded": "per-round counts recorded",
               "replayed": "per-round counts replayed from the recorded output",
               "whole runs": "runs whose every round drafted γ; per-round counts not recorded"}
    source = "; ".join(sources[s] for s in found["round_counts"].split("; ") if s)
    left_out = f"; {found['runs_without_round_counts']} of {found['runs']} runs left out (mixed rounds, no " \
        "per-round counts)" if found["runs_without_round_counts"] else ""
    alpha = (f"α {found['alpha_from_tau']:.2f} from the {found['full_rounds']} of {found['rounds']} rounds that "
             f"drafted γ = {gamma} ({source}{left_out})") if found["alpha_from_tau"] is not None else ""
    c = leviathan.draft_cost(method, run.get("costs"))
    parts = [row["label"], alpha, f"c {c:.2f}" if c is not None else "",
             f"S with our t({gamma + 1}) {found['S_with_t']:.2f}×" if found["S_with_t"] else ""]
    return Measurement(f"{dtype}/{row['method']}/{row['kind']}", row["speedup"],
                       f"{row['speedup']:.2f}× over our greedy baseline on {row['kind']} prompts",
                       "; ".join(p for p in parts if p), f"{_models(run, [row])}, {dtype}", _hardware(meta),
                       repo_command(meta.get("command"), "python -m bench"), f"{stem}.json",
                       Figure(S, f"S = {S:.2f}×") if S else None, "" if S else found.get("note", ""))


def adaedl_over_static(results: Results) -> list[Measurement]:
    """AdaEDL's speed-up over the best static γ of the same T=1 sweep, paired by prompt kind, median over kinds."""
    out = []
    for stem, dtype, meta, run in _speed_runs(results):
        rows = _picked(run, lambda r: "/t1/" in (r.get("method") or ""))
        gains = []
        for kind in sorted({row["kind"] for row in rows}):
            ada = [r["speedup"] for r in rows if r["kind"] == kind and r["method"].endswith("adaedl")]
            static = [r["speedup"] for r in rows if r["kind"] == kind and "static" in r["method"]]
            if ada and static:
                gains.append(ada[0] / max(static))
        if gains:
            gain = statistics.median(gains)
            out.append(Measurement(dtype, gain, f"AdaEDL {gain:.2f}× the best static γ of the sweep",
                                   f"T = 1; median over {len(gains)} prompt kinds; the best static γ picked after "
                                   "the fact", f"{_models(run)}, {dtype}", _hardware(meta),
                                   repo_command(meta.get("command"), "python -m bench"), f"{stem}.json"))
    return out


def whisper_wer_delta(decoder: str) -> Callable[[Results], list[Measurement]]:
    """Mean WER change against beam search, in points, over every (model, set) of bench.whisper's table."""
    def measure(results: Results) -> list[Measurement]:
        out = []
        for stem, data in sorted(results.items()):
            table = [r for r in data.get("table") or [] if r.get("decoder") == decoder
                     and r.get("delta_vs_beam") is not None]
            if table:
                mean = statistics.mean(100 * r["delta_vs_beam"] for r in table)
                meta = data.get("meta") or {}
                models = ", ".join(sorted({r.get("model", "?") for r in table}))
                out.append(Measurement(decoder, mean, f"{mean:+.2f} WER points vs beam search".replace("-", "−"),
                                       f"{decoder}; mean of {len(table)} (model, set) pairs",
                                       f"{models}, {meta.get('dtype', 'float32')}", _hardware(meta),
                                       repo_command(meta.get("command"), "python -m bench.whisper"), f"{stem}.json"))
        return out
    return measure


def tree_speedup(key: str) -> Callable[[Results], list[Measurement]]:
    """Rows of bench.trees' files (trees-<target>.json) whose method starts with `key`."""
    def measure(results: Results) -> list[Measurement]:
        out = []
        for stem, data in sorted(results.items()):
            settings = data.get("settings") or {}
            if not stem.startswith("trees-"):
                continue
            for row in data.get("rows") or []:
                if not row["method"].startswith(key) or row.get("speedup") is None:
                    continue
                tau = f"; τ {row['tau']:.2f}" if row.get("tau") else ""
                out.append(Measurement(
                    row["method"], row["speedup"], f"{row['speedup']:.2f}× over our greedy baseline",
                    f"{row['label']}; {settings.get('prompts')} prompts × {settings.get('reps')} reps{tau}",
                    f"{settings.get('target')}, {settings.get('dtype')}",
                    f"{settings.get('machine', 'unknown machine')}, {settings.get('threads')} threads",
                    repo_command(settings.get("command"), "python -m bench.trees"), f"{stem}.json"))
        return out
    return measure


def dsbd_over_beam_sampling(results: Results) -> list[Measurement]:
    """bench.beams' files: DSBD's tokens/s over beam sampling's at DSBD's width (the median of runs paired by
    problem and seed where the file has them, else total over total), with both arms' quality and DSBD's peak KV."""
    out = []
    for stem, data in sorted(results.items()):
        arms = {row.get("key"): row for row in data.get("summary") or []}
        dsbd = arms.get("dsbd")
        beam = arms.get(f"beam-sampling-{dsbd.get('width')}") if dsbd else None
        if not (dsbd and beam and dsbd.get("tokens_per_second") and beam.get("tokens_per_second")):
            continue
        paired = [p for p in data.get("paired") or [] if p.get("metric") == "tokens_per_second"
                  and p.get("arm") == "dsbd" and p.get("against") == beam["key"] and p.get("median")]
        value = paired[0]["median"] if paired else dsbd["tokens_per_second"] / beam["tokens_per_second"]
        how = f"median of {paired[0]['n']} runs paired by problem and seed" if paired else "total tokens/s ratio"
        few = bool(paired) and paired[0]["n"] < 3  # one or two pairs say nothing about speed on a shared machine
        if few:
            how += " (too few to read a speed from: rerun with more problems or --repeats)"
        spec = arms.get("speculative") or {}
        kv = f"; peak KV {dsbd['peak_kv_bytes'] / spec['peak_kv_bytes']:.1f}× speculative sampling's" \
            if spec.get("peak_kv_bytes") else ""
        meta = data.get("meta") or {}
        out.append(Measurement(
            "dsbd", value, f"DSBD {value:.2f}× beam sampling's tokens/s at width {dsbd['width']}"
            + (f" ({paired[0]['n']} paired run{'s' if paired[0]['n'] > 1 else ''}: not yet a speed result)" if few
               else ""),
            f"{how}; HumanEval first {data.get('problems')} problems, {data.get('max_new_tokens')} new tokens, T = 1; "
            f"mean log p {dsbd['mean_logprob']:.2f} vs {beam['mean_logprob']:.2f}, pass@1 {dsbd['pass_at_1']:.2f} vs "
            f"{beam['pass_at_1']:.2f}{kv}", f"{data.get('target')} + {data.get('draft')} draft, "
            f"{meta.get('dtype', 'float32')}", _hardware(meta),
            repo_command(meta.get("command"), "python -m bench.beams"), f"{stem}.json"))
    return out


def either(*measures: Callable[[Results], list[Measurement]]) -> Callable[[Results], list[Measurement]]:
    """Every measurement any of `measures` finds (a method measured by more than one benchmark)."""
    return lambda results: [m for measure in measures for m in measure(results)]


def batch_over_batch_1(results: Results) -> list[Measurement]:
    """bench.batch's files (batch-<target>.json): batched speculative decoding's total tokens/s at the largest B over
    the same method at B = 1, one measurement per (method, prompt set), with per-row equivalence and realignment."""
    out = []
    for stem, data in sorted(results.items()):
        if not stem.startswith("batch-"):
            continue
        settings = data.get("settings") or {}
        rows = [r for r in data.get("rows") or [] if r.get("method") != "baseline"]
        for key in dict.fromkeys((r["method"], r["set"]) for r in rows):
            mine = sorted((r for r in rows if (r["method"], r["set"]) == key), key=lambda r: r["batch"])
            top = mine[-1]
            if top.get("over_batch_1") is None:
                continue
            every = [r for r in data.get("rows") or [] if r.get("set") == key[1]]
            same = sum(r["equivalence"]["same"] + r["equivalence"]["rounding"] for r in every)
            total = sum(sum(r["equivalence"].values()) for r in every)
            base = top.get("over_batched_baseline")
            out.append(Measurement(
                f"{key[0]}/{key[1]}", top["over_batch_1"],
                f"{top['over_batch_1']:.2f}× its batch-1 tokens/s at B = {top['batch']}",
                f"batched speculative · {key[0]} on {key[1]} prompts; {base:.2f}× the batched baseline at B = "
                f"{top['batch']}; realignment {100 * (top.get('realign_share') or 0):.1f}% of decode time; rows equal "
                f"to the row decoded alone {same}/{total} (rounding counted as equal)",
                f"{settings.get('target')}" + (f" + {settings['draft']} draft" if settings.get("draft") and
                                                key[0] == "draft-model" else "") + f", {settings.get('dtype')}",
                f"{settings.get('machine', 'unknown machine')}, {settings.get('threads')} threads",
                repo_command(settings.get("command"), "python -m bench.batch"), f"{stem}.json"))
    return out
