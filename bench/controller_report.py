"""The tables of bench/controller.py's results, from the run records alone (so an older file re-renders the same way):
speed-ups over the baseline, ratios to transformers' assisted generation on the same draft, the draft each side ran,
and the fixed chains' acceptance by depth.

    python -m bench.controller_report bench/results/controller-<target>.json   # rows and .md again from the records

Equal terms: a SpecLab arm is set beside transformers' arm that was handed the very same draft object (the same
draft_quant in the same run, bench/runner.py run_draft). An arm whose precision transformers did not run reads "–",
never a ratio against a draft of another precision: an int8 draft against a float32 one measures the int8 kernel.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import report

ASSISTED = "hf/assisted-"  # the prefix of transformers' assisted arms: hf/assisted-defaults…, hf/assisted-tuned…
QUANT_WORDS = {"none": "float32", "int8": "int8", "auto": "auto: int8 where measured faster"}


def rows(records: list[dict], order: list[str] | None = None) -> list[dict]:
    """Per method (in `order`, default first appearance) and prompt kind: speed-up over the same-temperature
    baseline, ratios to transformers' tuned and default assisted arms on the same draft, the draft, τ, caps."""
    out = []
    kinds = sorted({r["prompt_kind"] for r in records}, key=report._kind_order)
    for key in order or list(dict.fromkeys(r["method"] for r in records)):
        mine_all = [r for r in records if r["method"] == key]
        if not mine_all:
            continue
        first, suffix = mine_all[0], "@t1" if mine_all[0]["temperature"] else ""
        quant = first.get("draft_quant")
        for kind in kinds + ["all"]:
            chosen = None if kind == "all" else (kind,)
            mine = [r for r in mine_all if kind == "all" or r["prompt_kind"] == kind]
            if not mine:
                continue
            caps = [c for r in mine for c in r.get("controller_caps") or []]
            out.append({"method": key, "label": first["label"], "kind": kind, "temperature": first["temperature"],
                        "draft": draft_words(mine), "draft_quant": quant, "draft_ms": draft_ms(mine),
                        "speedup": _ratio(records, key, "ours/baseline" + suffix, chosen),
                        "vs_hf_tuned": _ratio(records, key, assisted_key(records, "tuned", quant, suffix), chosen),
                        "vs_hf_defaults": _ratio(records, key, assisted_key(records, "defaults", quant, suffix),
                                                 chosen),
                        "tau": report.median([r["tau"] for r in mine]),
                        "mean_cap": sum(caps) / len(caps) if caps else None,
                        "identical": _identical(mine), "runs": len(mine)})
    return out


def assisted_key(records: list[dict], role: str, quant: str | None, suffix: str) -> str | None:
    """The key of transformers' assisted arm in this role ("tuned" | "defaults") that decoded with the same draft
    (draft_quant) at the same temperature; None where there is none (or this arm had no draft)."""
    if quant is None:
        return None
    keys = {r["method"] for r in records if r["method"].startswith(ASSISTED + role)
            and r["method"].endswith("@t1") == bool(suffix) and r.get("draft_quant") == quant}
    return next(iter(keys)) if len(keys) == 1 else None


def draft_words(runs: list[dict]) -> str:
    """The draft these runs decoded with: measured from the draft object (draft_precision) where the file recorded
    it, else the requested draft_quant, marked as such; "–" without a draft."""
    measured = sorted({r["draft_precision"] for r in runs if r.get("draft_precision")})
    if measured:
        return ", ".join(measured)
    requested = sorted({r["draft_quant"] for r in runs if r.get("draft_quant")})
    return ", ".join(QUANT_WORDS[q].split(":")[0] for q in requested) + " (requested)" if requested else "–"


def draft_ms(runs: list[dict]) -> float | None:
    """Median milliseconds per draft forward (SpecLab's runs: draft-phase time ÷ draft forwards): what tells an
    int8 draft from a float32 one in a file that did not record the precision."""
    return report.median([1000 * r["phase_seconds"]["draft"] / r["draft_forwards"] for r in runs
                          if r.get("draft_forwards") and (r.get("phase_seconds") or {}).get("draft")])


def _ratio(records, method, reference, kinds):
    if reference is None or method == reference or not any(r["method"] == reference for r in records):
        return None
    return report.ratio_over(records, method, reference, kinds)["median"]


def _identical(runs: list[dict]) -> str:
    same = [r["identical_to_baseline"] for r in runs if r.get("identical_to_baseline") is not None]
    return f"{sum(same)}/{len(same)}" if same else "–"


# --- the page ----------------------------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    s = result["settings"]
    load = (s.get("load") or {}).get("label") or "machine load not recorded"
    lines = [f"# The draft controller on {s['target']} (float32, {s['machine']})", "",
             f"`{s['command']}` · {s['prompts']} scored prompts × {s['reps']} repetitions × {s['max_new_tokens']} new "
             f"tokens · {s['threads']} threads · {s['minutes']:.0f} min · {load}", "",
             "Speed-up: median over prompts of the per-repetition ratio to SpecLab's baseline at the same temperature "
             "(steady tokens/s, decoders/clock.py). vs HF tuned / defaults, same draft: the same ratio against "
             "transformers' assisted generation handed the very same draft object (the row's draft precision), at "
             "its best grid setting (chosen on separate tuning prompts) and at its defaults, same kernels; – where "
             "transformers did not run that draft. Draft: the draft's precision, read from the draft object each "
             "run decoded with (\"requested\": the file predates recording it, and shows the draft_quant the arm "
             "asked for; auto = int8 where this machine measured it faster); ms/draft: SpecLab's median time per "
             "draft forward, which tells an int8 draft from a float32 one. Cap: the controller's mean per-round "
             "cap (chain: tokens; tree: nodes sent).", "",
             _costs_line(result["costs"]), "", *[part for line in assisted_lines(result) for part in (line, "")],
             "| method | draft | ms/draft | kind | T | speed-up | vs HF tuned, same draft | vs HF defaults, same draft "
             "| τ | cap | same as baseline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r.get('draft', '–')} | {report._f(r.get('draft_ms'), 0)} | {r['kind']} | "
                     f"{r['temperature']:g} | "
                     f"{report._f(r['speedup'], 2, '×')} | {report._f(r['vs_hf_tuned'], 2, '×')} | "
                     f"{report._f(r['vs_hf_defaults'], 2, '×')} | {report._f(r['tau'])} | "
                     f"{report._f(r['mean_cap'], 1)} | {r['identical']} |")
    lines += depth_lines(result)
    return "\n".join(lines) + "\n"


def assisted_lines(result: dict) -> list[str]:
    """One line per draft precision: what transformers' assisted generation ran with, "tuned" only where it was."""
    records, s = result["records"], result["settings"]
    ran = {r.get("draft_quant") for r in records if r["method"].startswith(ASSISTED)}
    if not ran:
        why = "the target has no draft model in the registry" if not s.get("draft") else \
            "this run's --methods left its arms out"
        return [f"transformers' assisted generation: not run ({why})."]
    tuned = tuned_settings(result)
    lines = []
    for quant in sorted(ran, key=str):
        what = QUANT_WORDS.get(quant, "not recorded")
        if any(r["method"].startswith(ASSISTED + "tuned") and r.get("draft_quant") == quant for r in records):
            setting = tuned.get(quant)
            lines.append(f"transformers' assisted generation, {what} draft: tuned on separate tuning prompts to "
                         f"{_assisted(setting) if setting else 'a setting this file does not record'}; and at its "
                         "defaults.")
        else:
            lines.append(f"transformers' assisted generation, {what} draft: at its defaults only (not tuned).")
    return lines


def tuned_settings(result: dict) -> dict:
    """draft_quant -> HF's tuned setting. Files from before the draft precision was an arm kept one setting, tuned
    on the float32 draft the runner then handed to transformers."""
    tuned = result.get("assisted_tuned") or {}
    return {"none": tuned} if "num_assistant_tokens" in tuned else tuned


def _assisted(settings: dict) -> str:
    return (f"{settings['num_assistant_tokens']} tokens, confidence {settings['assistant_confidence_threshold']}, "
            f"{settings['num_assistant_tokens_schedule']}")


def acceptance_by_depth(records: list[dict], method: str, kind: str, depths: int = 6) -> list[float | None]:
    """P(draft k accepted | drafts 1..k-1 were), k = 1..depths, over the rounds of `method` on `kind` (greedy
    chains). A geometric acceptance model has one value for every k; rising values mean acceptance comes in runs,
    which makes a longer draft worth more than a single α predicts."""
    tested, accepted = [0] * depths, [0] * depths
    for r in records:
        if r["method"] != method or r["prompt_kind"] != kind:
            continue
        for drafted, kept in r.get("rounds") or []:
            for k in range(min(drafted, kept + 1, depths)):  # depth k+1 was tested: drafted, and 1..k accepted
                tested[k] += 1
                accepted[k] += k < kept
    return [a / t if t else None for a, t in zip(accepted, tested)]


FIXED_CHAINS = ("ours/static-4", "ours/adaedl-8", "ours/lookup-10")


def depth_lines(result: dict) -> list[str]:
    """The fixed chains' acceptance by depth per prompt kind at T 0 (each draft precision its own line)."""
    keys = dict.fromkeys(r["method"] for r in result["records"])
    fixed = [k for k in keys if k.startswith(FIXED_CHAINS) and not k.endswith("@t1")]
    if not fixed:
        return []
    kinds = sorted({r["prompt_kind"] for r in result["records"]}, key=report._kind_order)
    lines = ["", "Acceptance by depth at T 0 (greedy chains of the fixed presets: P(draft k accepted | 1..k−1 were)):",
             "", "| method | kind | k 1 | 2 | 3 | 4 | 5 | 6 |", "|---|---|---|---|---|---|---|---|"]
    for method in sorted(fixed, key=lambda k: (FIXED_CHAINS.index(next(f for f in FIXED_CHAINS if k.startswith(f))),
                                               k)):
        for kind in kinds:
            alphas = acceptance_by_depth(result["records"], method, kind)
            lines.append(f"| {method} | {kind} | " + " | ".join(report._f(a, 2) for a in alphas) + " |")
    return lines


def _costs_line(curves: dict) -> str:
    parts = []
    for role, curve in curves.items():
        shown = ", ".join(f"t({n}) {curve['chain'][str(n)]:.2f}" for n in (2, 4, 8, 16, 32) if str(n) in curve["chain"])
        parts.append(f"{role} {curve['model']}: one step {curve['step_seconds'] * 1000:.0f} ms; {shown}")
    return "Cost curves (5 repetitions, monotone): " + "; ".join(parts) + "."


def rerender(result: dict) -> dict:
    """A controller result with its rows recomputed from its records (the rows' order kept)."""
    order = list(dict.fromkeys(r["method"] for r in result.get("rows") or [])) or None
    return {**result, "rows": rows(result["records"], order)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.controller_report", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="bench/results/controller-*.json")
    for path in parser.parse_args(argv).files:
        result = rerender(json.loads(path.read_text()))
        path.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
        print(f"rewrote the rows of {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
