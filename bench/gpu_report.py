"""The markdown page of `python -m bench.gpu` (bench/gpu.py): the checks, t(n) per path, the race, transformers'
static-cache arms, and issue 32's targets, each marked met, missed or not measured."""
from __future__ import annotations

from . import report

GRAPH_BASELINE = "ours/baseline"
TARGETS = {"tok_s": 300.0, "ms_step": 3.3, "flat": 1.5, "speedup": 2.5, "vs_hf": 2.0}


def markdown(result: dict) -> str:
    meta, stages = result["meta"], result["stages"]
    lines = [f"# SpecLab on {meta['device']}" + (" — DRY RUN on the CPU (no GPU: figures test the pipeline only)"
                                                 if meta["dry_run"] else ""), "",
             f"`{meta['command']}` · {meta['target']} {meta['dtype']} · PyTorch {meta['torch']} · transformers "
             f"{meta['transformers']} · commit {meta['commit']} · {meta['date']} · {meta.get('minutes', 0):.1f} min",
             ""]
    lines += _errors(stages) + _checks(stages.get("checks")) + _steps(stages.get("steps"))
    race = stages.get("race") or {}
    rows = race_rows(race) if race.get("records") else []
    lines += _race(rows, race) + _hf_static(stages.get("hf-static")) + _targets(rows, stages, meta)
    return "\n".join(lines) + "\n"


def _errors(stages: dict) -> list[str]:
    failed = [f"- **{name}** failed: `{s['error']}`" for name, s in stages.items() if "error" in s]
    return (["## Stages that failed", "", *failed, ""]) if failed else []


def _checks(checks: dict | None) -> list[str]:
    if not checks or "error" in checks:
        return ["## Checks", "", "not run" if not checks else "failed (above)", ""]
    return ["## Checks", "", f"`{checks['command']}` → exit {checks['returncode']} ({checks['seconds']:.0f} s; "
            f"log: {checks['log']})", "", *[f"    {line}" for line in checks["summary"]], ""]


def _steps(steps: dict | None) -> list[str]:
    if not steps or "error" in steps:
        return []
    curves, widths = steps["curves"], steps["widths"]
    head = "| path | t(1) ms | " + " | ".join(f"t({n})" for n in widths) + " |"
    lines = ["## One forward of n tokens after a 128-token context: t(n)/t(1)", "",
             "Medians over the repetitions (interleaved over n after two warm-up passes; graphs: each n its own "
             "captured graph). \"graphs-tree\": a branching tree of n nodes under the 4-D tree mask; "
             "\"graphs-stock\": the same graphs on transformers' own RMSNorm modules (the other rows fuse them: "
             "decoders/runtime/kernels.py).", "", head,
             "|" + "---|" * (len(widths) + 2)]
    for path, curve in curves.items():
        t = {int(n): v for n, v in curve["t"].items()}
        first = {int(n): v for n, v in curve["seconds"].items()}[widths[0]]
        lines.append(f"| {path} | {first * 1e3:.2f} | " + " | ".join(f"{t[n]:.2f}" for n in widths) + " |")
    return lines + [""]


def race_rows(race: dict) -> list[dict]:
    records, rows = race["records"], []
    for method in race["methods"]:
        mine = [r for r in records if r["method"] == method["key"]]
        ratio = report.ratio_over(records, method["key"], GRAPH_BASELINE) if method["key"] != GRAPH_BASELINE \
            else None
        same = [r["identical_to_baseline"] for r in mine if r.get("identical_to_baseline") is not None]
        tok_s = report.median([r["tok_s"] for r in mine])
        rows.append({"key": method["key"], "label": method["label"], "tok_s": tok_s,
                     "ms_step": 1e3 / tok_s if tok_s and method["key"].startswith(("ours/baseline", "hf/greedy"))
                     else None,
                     "speedup": ratio["median"] if ratio else None, "spread": ratio["spread"] if ratio else None,
                     "tau": report.median([r["tau"] for r in mine]), "same": f"{sum(same)}/{len(same)}",
                     "all_same": bool(same) and all(same), "caps": (race.get("caps") or {}).get(method["key"]),
                     "forwards": _forwards(mine)})
    return rows


def _forwards(records: list[dict]) -> str:
    """The target's forwards over the records: how many replayed a graph, of all, and the widths they ran at."""
    runs = [(r.get("runtime") or {}).get("target") or {} for r in records]
    graph, eager = sum(t.get("graph", 0) for t in runs), sum(t.get("eager", 0) for t in runs)
    widths = sorted({w for t in runs for w in t.get("widths", [])})
    return f"{graph}/{graph + eager} · {','.join(map(str, widths))}" if graph + eager else ""


def _bucket_ms(race: dict) -> list[str]:
    """Each bucket's replay as the graph baseline timed it (decoders/runtime/graphs.py pads to the cheapest that holds n)."""
    timed = next((r["runtime"]["target"]["bucket_ms"] for r in race["records"] if r["method"] == GRAPH_BASELINE
                  and ((r.get("runtime") or {}).get("target") or {}).get("bucket_ms")), None)
    if not timed:
        return []
    return ["Each bucket's graph replay as timed once and stored for this device and model (ms), from which a forward of n tokens pads to the "
            "cheapest bucket that holds n: " + ", ".join(f"{w}: {ms}" for w, ms in timed.items()) + ".", ""]


def _race(rows: list[dict], race: dict) -> list[str]:
    if not rows:
        return []
    lines = ["## Race on code prompts (greedy)", "",
             f"Prompts: {', '.join(race['prompts'])}. Speed-up = median over prompts of the per-repetition ratio to "
             "the graph baseline of the same prompt and repetition (range in brackets); τ = new tokens ÷ target "
             "forward calls (prefill included); same = outputs equal to the graph baseline's; caps = the cost-aware "
             "controller's per-round cap (chain: drafts allowed; tree: nodes sent), median (range)."
             + (f" **Stopped early: {race['partial']}** (the call's time limit)." if race.get("partial") else "")
             + "".join(f" Left out: {key} ({why})." for key, why in (race.get("failed_arms") or {}).items()), "",
             "| method | tokens/s | ms/step | speed-up vs graph baseline | τ | same | caps "
             "| target forwards: graphs/all · widths |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = f" ({r['spread'][0]:.2f}–{r['spread'][1]:.2f})" if r["spread"] else ""
        lines.append(f"| {r['label']} | {report._f(r['tok_s'], 1)} | {report._f(r['ms_step'], 2)} | "
                     f"{report._f(r['speedup'], 2, '×') + spread if r['speedup'] else '1 (yardstick)'} | "
                     f"{report._f(r['tau'])} | {r['same']} | {_caps(r['caps'])} | {r['forwards']} |")
    return lines + [""] + _bucket_ms(race)


def _caps(caps: dict | None) -> str:
    return f"{caps['median']:g} ({caps['min']}–{caps['max']})" if caps else ""


def _hf_static(stage: dict | None) -> list[str]:
    if not stage or "error" in stage:
        return []
    lines = ["## transformers with its own static cache", "",
             "First call per prompt is the warm-up (and, for the compiled arm, the compile); an error ends that arm "
             "on that prompt and is shown as its result.", "", "| arm | tokens/s (timed calls) | same as baseline | "
             "error |", "|---|---|---|---|"]
    keys = list(dict.fromkeys(r["method"] for r in stage["runs"]))
    for key in keys:
        runs = [r for r in stage["runs"] if r["method"] == key]
        timed = [r for r in runs if r.get("rep", 0) >= 0 and "tok_s" in r]
        same = [r["identical_to_baseline"] for r in timed if "identical_to_baseline" in r]
        errors = sorted({r["error"] for r in runs if "error" in r})
        lines.append(f"| {key} | {report._f(report.median([r['tok_s'] for r in timed]), 1)} | "
                     f"{sum(same)}/{len(same)} | {'; '.join(errors)} |")
    return lines + [""]


def _targets(rows: list[dict], stages: dict, meta: dict) -> list[str]:
    by_key = {r["key"]: r for r in rows}
    base = by_key.get(GRAPH_BASELINE, {})
    spec = [r for r in rows if r["key"].startswith("ours/") and not r["key"].startswith("ours/baseline")]
    best = max((r for r in spec if r["speedup"]), key=lambda r: r["speedup"], default=None)
    hf_best = max((r["tok_s"] for r in rows if r["key"].startswith("hf/") and r["tok_s"]), default=None)
    static = [r.get("tok_s") for r in (stages.get("hf-static") or {}).get("runs", []) if r.get("rep", 0) >= 0]
    hf_best = max([v for v in [hf_best, *static] if v], default=None)
    curve = ((stages.get("steps") or {}).get("curves") or {}).get("graphs")
    flat = {int(n): v for n, v in curve["t"].items()}.get(64) if curve else None
    every_same = bool(rows) and all(r["all_same"] for r in rows if r["key"].startswith("ours/"))
    checks = [("graph baseline ≥ 300 tok/s", base.get("tok_s"), lambda v: v >= TARGETS["tok_s"], "{:.1f} tok/s"),
              ("graph baseline ≤ 3.3 ms a step", base.get("ms_step"), lambda v: v <= TARGETS["ms_step"], "{:.2f} ms"),
              ("t(64)/t(1) ≤ 1.5 with graphs", flat, lambda v: v <= TARGETS["flat"], "{:.2f}"),
              ("best speculative ≥ 2.5× the graph baseline", best and best["speedup"],
               lambda v: v >= TARGETS["speedup"], "{:.2f}×" + (f" ({best['label']})" if best else "")),
              ("best speculative ≥ 2× transformers' best", best and hf_best and best["tok_s"] / hf_best,
               lambda v: v >= TARGETS["vs_hf"], "{:.2f}×"),
              ("every SpecLab output equal to the baseline", every_same if rows else None, bool, "{}")]
    lines = ["## Issue 32's targets", "", "| target | measured | |", "|---|---|---|"]
    for name, value, ok, fmt in checks:
        verdict = "not measured" if value is None else ("met" if ok(value) else "missed")
        if meta["dry_run"] and value is not None:
            verdict += " (dry run: not a result)"
        lines.append(f"| {name} | {fmt.format(value) if value is not None else '–'} | {verdict} |")
    return lines + [""]
