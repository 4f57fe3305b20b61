"""What bench/claims.py reads from the results files: one Measurement per comparable figure, and its ratio to the
paper's figure in the one wording every row uses ("0.58× the paper's 2–2.5×").

A measure is a function results -> [Measurement]; each measurement has a `key` unique within its results file, so a
claim can name its headline run as (file stem, key).
"""
from __future__ import annotations

import importlib.util

import json
import re
import statistics
from pathlib import Path
from typing import Callable

from . import leviathan
from .claim_types import Figure, Measurement, Results
from .common import NOREC, RESULTS

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
    """The machine, its threads and, where the file measured it, how loaded it was (bench/common.py LoadMeter)."""
    load = (meta.get("load") or {}).get("label")
    parts = [meta.get("machine") or "unknown machine", f"{meta.get('threads')} threads" if meta.get("threads") else "",
             load or ""]
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
                    f"{settings.get('target')}, {settings.get('dtype')}", _hardware(settings),
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


def batch_end_to_end(results: Results) -> list[Measurement]:
    """bench.batch's files (batch-<target>.json), end to end (prefill included, as a user waits for it): batched
    speculative decoding's tokens/s at the largest B over the same method at B = 1 (the paper's quantity), said next
    to the batched baseline at that B, with whether the rows went ragged, per-row equivalence and realignment. The
    decode-only figures (prefill left out) appear only under that label."""
    out = []
    for stem, data in sorted(results.items()):
        if not stem.startswith("batch-"):
            continue
        settings = data.get("settings") or {}
        rows = data.get("rows") or []
        for method, kind in dict.fromkeys((r["method"], r["set"]) for r in rows if r.get("method") != "baseline"):
            mine = {r["batch"]: r for r in rows if (r["method"], r["set"]) == (method, kind)}
            base = {r["batch"]: r for r in rows if (r["method"], r["set"]) == ("baseline", kind)}
            top = max(mine)
            if 1 not in mine or top not in base or not all(_e2e(r) for r in (mine[1], mine[top], base[top])):
                continue
            every = [r for r in rows if r.get("set") == kind]
            out.append(_batch_measurement(stem, settings, method, kind, mine[1], mine[top], base[top], every))
    return out


def _e2e(row: dict) -> float | None:
    return row.get("e2e_tokens_per_second")


def _batch_measurement(stem, settings, method, kind, alone, top, base, every) -> Measurement:
    b = top["batch"]
    over_1, over_base = _e2e(top) / _e2e(alone), _e2e(top) / _e2e(base)
    taus = top.get("tau") or []
    if not taus:
        ragged = "τ per row not recorded"
    elif max(taus) > min(taus):
        ragged = f"rows ragged: τ per row {min(taus):.2f}–{max(taus):.2f}"
    else:  # every row advanced in step: the realignment machinery had nothing to do
        ragged = f"never ragged: every row τ {taus[0]:.2f}"
    same = sum(r["equivalence"]["same"] + r["equivalence"]["rounding"] for r in every)
    total = sum(sum(r["equivalence"].values()) for r in every)
    wall = top["prefill_seconds"] + top["decode_seconds"]
    draft = f" + {settings['draft']} draft" if settings.get("draft") and method == "draft-model" else ""
    return Measurement(
        f"{method}/{kind}", over_1,
        f"{over_base:.2f}× the batched baseline at B = {b}, end to end ({over_1:.2f}× its own batch-1 tokens/s)",
        f"batched speculative · {method} on {kind} prompts, end to end (prefill included); {ragged}; decode-only "
        f"(prefill left out): {top['over_batch_1']:.2f}× its batch-1 tokens/s and {top['over_batched_baseline']:.2f}× "
        f"the batched baseline; prefill {top['prefill_seconds']:.1f} s of {wall:.1f} s at B = {b}; realignment "
        f"{100 * (top.get('realign_share') or 0):.1f}% of decode time; rows equal to the row decoded alone "
        f"{same}/{total} (rounding counted as equal)",
        f"{settings.get('target')}{draft}, {settings.get('dtype')}", _hardware(settings),
        repo_command(settings.get("command"), "python -m bench.batch"), f"{stem}.json")


def self_drafter_speedup(method: str, what: str) -> Callable[[Results], list[Measurement]]:
    """This method's row in bench.self_drafters' files (self-drafters-<target>.json), its α and draft cost as
    detail."""
    def measure(results: Results) -> list[Measurement]:
        out = []
        for stem, data in sorted(results.items()):
            if not stem.startswith("self-drafters-"):
                continue
            s = data.get("settings") or {}
            for row in data.get("rows") or []:
                if row.get("method") != method or row.get("speedup") is None:
                    continue
                alpha = f"α(1) {row['alpha'][0]:.2f}; " if row.get("alpha") and row["alpha"][0] is not None else ""
                cost = f"draft cost {row['draft_cost']:.2f} of a target step; " if row.get("draft_cost") else ""
                tau = f"τ {row['tau']:.2f}; " if row.get("tau") is not None else ""
                out.append(Measurement(
                    method, row["speedup"], f"{row['speedup']:.2f}× over our greedy baseline",
                    f"{what}: {row['label']}; {alpha}{cost}{tau}{s.get('prompts')} prompts × {s.get('reps')} reps",
                    f"{s.get('target')}, {s.get('dtype')}", _hardware(s),
                    repo_command(s.get("command"), "python -m bench.self_drafters"), f"{stem}.json"))
        return out
    return measure


def whisper_lora(results: Results) -> list[Measurement]:
    """bench.whisper_finetune's files (whisper-finetune*.json): LoRA's held-out WER against full fine-tuning and
    against zero-shot, in points, from arms of the same run only, with how small the held-out set is and how much
    one clip weighs (recomputed from the recorded transcripts)."""
    out = []
    for stem, data in sorted(results.items()):
        if not stem.startswith("whisper-finetune"):
            continue
        meta = data.get("meta") or {}
        arms = {r["arm"]: r for r in data.get("results") or [] if r.get("wer") is not None}
        if "lora" not in arms:
            continue
        setting = f"{meta.get('model', 'whisper')}, float32, {meta.get('lora') or 'hand-written LoRA'}"
        command = repo_command(meta.get("command"), "python -m bench.whisper_finetune")
        detail = _lora_detail(meta, arms)
        for other, figure in (("full", PAPER_LORA_VS_FULL), ("zero-shot", PAPER_LORA_VS_ZERO_SHOT)):
            if other not in arms:
                continue
            delta = 100 * (arms["lora"]["wer"] - arms[other]["wer"])
            points = f"{delta:+.2f}".replace("-", "−")
            out.append(Measurement(f"lora-vs-{other}", delta, f"LoRA {points} WER points vs {other} fine-tuning"
                                   if other == "full" else f"LoRA {points} WER points vs {other}", detail, setting,
                                   _hardware(meta), command, f"{stem}.json", figure))
        if not {"full", "zero-shot"} & set(arms):
            out.append(Measurement("lora", None, f"LoRA {100 * arms['lora']['wer']:.2f}% held-out WER", detail,
                                   setting, _hardware(meta), command, f"{stem}.json",
                                   note="this run trained the LoRA arm alone: no other arm in the same run to "
                                        "compare with"))
    return out


# arXiv 2309.10299 abstract (Whisper-Tiny, Vietnamese): negative = LoRA better
PAPER_LORA_VS_FULL = Figure(-1.45, "−1.45 WER points")
PAPER_LORA_VS_ZERO_SHOT = Figure(-38.49, "−38.49 WER points")


def _lora_detail(meta: dict, arms: dict) -> str:
    """Held-out WER of each arm, the set's size in syllables, and the clip that moves WER most."""
    wers = ", ".join(f"{arm} {100 * r['wer']:.2f}%" for arm, r in arms.items())
    parts = [f"held-out WER {wers}; {meta.get('steps')} steps, rank {meta.get('rank')}, seed {meta.get('seed')}; "
             f"espeak-ng Vietnamese, {meta.get('train_sentences')} training and {meta.get('held_out_sentences')} "
             "held-out sentences"]
    references = meta.get("held_out_references") or []
    if references and all(len(r.get("texts") or []) == len(references) for r in arms.values()):
        parts.append(_one_clip(references, arms) if importlib.util.find_spec("whisper") else
                     "the per-clip detail is recomputed with openai-whisper's text normaliser, not installed here")
    return "; ".join(parts)


def _one_clip(references: list[str], arms: dict) -> str:
    """How many syllables the held-out set has, and how WER reads without the clip where an arm erred most (on
    10 clips, one looping transcript can carry half of an arm's errors)."""
    from decoders.whisper.wer import align, corpus_wer, normalise

    words = sum(len(normalise(ref, "vi")) for ref in references)
    errors = {arm: [sum(op.op != "ok" for op in align(ref, hyp, "vi")) for ref, hyp in zip(references, r["texts"])]
              for arm, r in arms.items()}
    arm, clip = max(((a, i) for a, e in errors.items() for i in range(len(e))), key=lambda ai: errors[ai[0]][ai[1]])
    keep = [i for i in range(len(references)) if i != clip]
    without = ", ".join(f"{a} {100 * corpus_wer([(references[i], r['texts'][i]) for i in keep], 'vi'):.2f}%"
                        for a, r in arms.items())
    return (f"{words} held-out syllables (one syllable = {100 / words:.1f} points); the heaviest clip: {arm} made "
            f"{errors[arm][clip]} of its {sum(errors[arm])} errors on \"{references[clip]}\"; without that clip: "
            f"{without}")
