"""The cost-aware draft controller against transformers' best and SpecLab's fixed presets, same run, same kernels.

    python -m bench.controller --target qwen2.5-coder-1.5b   # the pair: draft-model chains and trees
    python -m bench.controller --target smollm2-135m         # prompt lookup, layer skip, EAGLE-head trees

1. This machine's cost curves (decoders/costs.py, 5 interleaved repetitions, monotone), target and draft.
2. transformers' assisted generation tuned on the TUNING prompts (a grid of assistant tokens × confidence threshold ×
   schedule, bench/tuning.py), never on a scored prompt.
3. Every method on every scored prompt (ShareGPT chat, HumanEval writing and editing) × repetitions, interleaved, at
   temperature 0 and 1: SpecLab's baseline, the controller (chain and tree), SpecLab's fixed presets, transformers'
   greedy / assisted (its defaults and the tuned setting) / prompt lookup, all on SpecLab's packed kernels.
Speeds use the clock's steady reading for both sides (decoders/clock.py); a ratio is the median over prompts of the
per-repetition paired ratio. Writes bench/results/controller-<target>.{json,md}.
"""
from __future__ import annotations

import argparse
import platform
import time

import torch

from decoders import costs
from decoders.controller import TREE_BOUNDS

from . import cli, peers, report, tuning
from .__main__ import load_prompts, machine
from .runner import Method, hf, ours, run_suite, set_threads

COST = dict(controller="cost")
T1 = dict(temperature=1.0)


def pair_methods(assisted_tuned: dict, temperature: float) -> list[Method]:
    """The Qwen pair: chains and trees grown by the 0.5B draft model."""
    t = {"temperature": temperature} if temperature else {}
    suffix = "@t1" if temperature else ""
    base = [ours("ours/baseline" + suffix, "SpecLab baseline", "baseline", **t),
            ours("ours/chain-cost" + suffix, "SpecLab draft model · AdaEDL · cost-aware cap (controller; draft "
                 "int8 where measured faster)", "draft-model", rule="adaedl", **COST, **t),
            ours("ours/tree-cost" + suffix, "SpecLab EAGLE-2 tree · cost-aware (controller)", "eagle2",
                 **TREE_BOUNDS, **COST, **t),
            ours("ours/chain-cost-f32" + suffix, "SpecLab draft model · AdaEDL · cost-aware cap, float32 draft",
                 "draft-model", rule="adaedl", draft_quant="none", **COST, **t),
            ours("ours/adaedl-8" + suffix, "SpecLab draft model · AdaEDL L_max 8 (fixed)", "draft-model",
                 rule="adaedl", max_draft=8, **t),
            ours("ours/static-4" + suffix, "SpecLab draft model · static γ=4 (fixed)", "draft-model", rule="static",
                 gamma=4, **t),
            hf("hf/greedy" + suffix, "transformers greedy" + (" (sampling)" if temperature else ""), "baseline",
               "packed", temperature=temperature),
            tuning.hf_assisted("hf/assisted-defaults" + suffix, dict(peers.ASSISTED_DEFAULTS), "packed"),
            tuning.hf_assisted("hf/assisted-tuned" + suffix, assisted_tuned, "packed")]
    if not temperature:
        base += [ours("ours/eagle2-paper", "SpecLab EAGLE-2 · K10 D6 M59 (paper, fixed)", "eagle2", tree_k=10,
                      tree_depth=6, tree_m=59),
                 ours("ours/lookup-cost", "SpecLab prompt lookup · cost-aware length (controller)", "prompt-lookup",
                      rule="static", **COST),
                 tuning.hf_prompt_lookup("hf/prompt-lookup", dict(peers.PROMPT_LOOKUP_DEFAULTS), "packed")]
    return [_sampled(m, temperature) for m in base]


def single_methods(temperature: float) -> list[Method]:
    """SmolLM2 (no draft model in the registry): copies, the target's own layers, and its EAGLE head."""
    t = {"temperature": temperature} if temperature else {}
    suffix = "@t1" if temperature else ""
    base = [ours("ours/baseline" + suffix, "SpecLab baseline", "baseline", **t),
            ours("ours/lookup-cost" + suffix, "SpecLab prompt lookup · cost-aware length (controller)",
                 "prompt-lookup", rule="static", **COST, **t),
            ours("ours/lookup-10" + suffix, "SpecLab prompt lookup · 10 tokens (fixed)", "prompt-lookup",
                 rule="static", gamma=10, **t),
            ours("ours/tree-head-cost" + suffix, "SpecLab EAGLE-2 · EAGLE head · cost-aware (controller)", "eagle2",
                 eagle_head="auto", **TREE_BOUNDS, **COST, **t),
            ours("ours/layer-skip-cost" + suffix, "SpecLab layer skip · AdaEDL · cost-aware cap (controller)",
                 "layer-skip", rule="adaedl", **COST, **t),
            hf("hf/greedy" + suffix, "transformers greedy" + (" (sampling)" if temperature else ""), "baseline",
               "packed", temperature=temperature)]
    if not temperature:
        base += [ours("ours/eagle2-head-paper", "SpecLab EAGLE-2 · EAGLE head · K10 D6 M59 (paper, fixed)", "eagle2",
                      eagle_head="auto", tree_k=10, tree_depth=6, tree_m=59),
                 tuning.hf_prompt_lookup("hf/prompt-lookup", dict(peers.PROMPT_LOOKUP_DEFAULTS), "packed")]
    return [_sampled(m, temperature) for m in base]


def _sampled(method: Method, temperature: float) -> Method:
    """HF methods carry the temperature as a Method field (ours already have it)."""
    if method.family == "hf" and temperature and not method.temperature:
        return Method(method.key if method.key.endswith("@t1") else method.key + "@t1", method.label + " (sampling)",
                      method.family, method.kind, method.options, method.record, temperature, None,
                      kernels=method.kernels)
    return method


def tune_assisted(models: dict, args, log) -> dict:
    """transformers' best assisted setting on the tuning prompts (paired with SpecLab's baseline)."""
    from .__main__ import run_tuning

    group = [g for g in tuning.groups(argparse.Namespace(pl_ngram=2, sweep_on=False), True) if g.key == "hf/assisted"]
    prompts = load_prompts(args.tune_per_kind, None, split="tuning")
    decisions, _ = run_tuning(group, models, prompts, argparse.Namespace(tune_reps=1, tune_max_new=args.max_new_tokens),
                              log)
    return decisions["hf/assisted"]


def rows(records: list[dict], methods: list[Method]) -> list[dict]:
    """Per method and prompt kind: speed-up over the same-temperature baseline, over HF's tuned assisted, τ, caps."""
    out = []
    kinds = sorted({r["prompt_kind"] for r in records}, key=report._kind_order)
    for m in methods:
        suffix = "@t1" if m.temperature else ""
        for kind in kinds + ["all"]:
            chosen = None if kind == "all" else (kind,)
            mine = [r for r in records if r["method"] == m.key and (kind == "all" or r["prompt_kind"] == kind)]
            if not mine:
                continue
            caps = [c for r in mine for c in r.get("controller_caps") or []]
            out.append({"method": m.key, "label": m.label, "kind": kind, "temperature": m.temperature,
                        "speedup": _ratio(records, m.key, "ours/baseline" + suffix, chosen),
                        "vs_hf_tuned": _ratio(records, m.key, "hf/assisted-tuned" + suffix, chosen),
                        "vs_hf_defaults": _ratio(records, m.key, "hf/assisted-defaults" + suffix, chosen),
                        "tau": report.median([r["tau"] for r in mine]),
                        "mean_cap": sum(caps) / len(caps) if caps else None,
                        "identical": _identical(mine), "runs": len(mine)})
    return out


def _ratio(records, method, reference, kinds):
    if method == reference or not any(r["method"] == reference for r in records):
        return None
    return report.ratio_over(records, method, reference, kinds)["median"]


def _identical(runs: list[dict]) -> str:
    same = [r["identical_to_baseline"] for r in runs if r.get("identical_to_baseline") is not None]
    return f"{sum(same)}/{len(same)}" if same else "–"


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# The draft controller on {s['target']} (float32, {s['machine']})", "",
             f"`{s['command']}` · {s['prompts']} scored prompts × {s['reps']} repetitions × {s['max_new_tokens']} new "
             f"tokens · {s['threads']} threads · {s['minutes']:.0f} min", "",
             "Speed-up: median over prompts of the per-repetition ratio to SpecLab's baseline at the same temperature "
             "(steady tokens/s, decoders/clock.py). vs HF tuned / defaults: the same ratio against transformers' "
             "assisted generation at its best grid setting (chosen on separate tuning prompts) and at its defaults, "
             "same kernels. Cap: the controller's mean per-round cap (chain: tokens; tree: nodes sent).", "",
             _costs_line(result["costs"]), "",
             f"HF assisted, tuned: {tuning.assisted_label(result['assisted_tuned'])}.", "",
             "| method | kind | T | speed-up | vs HF tuned | vs HF defaults | τ | cap | same as baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r['kind']} | {r['temperature']:g} | {report._f(r['speedup'], 2, '×')} | "
                     f"{report._f(r['vs_hf_tuned'], 2, '×')} | {report._f(r['vs_hf_defaults'], 2, '×')} | "
                     f"{report._f(r['tau'])} | {report._f(r['mean_cap'], 1)} | {r['identical']} |")
    lines += depth_lines(result)
    return "\n".join(lines) + "\n"


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


def depth_lines(result: dict) -> list[str]:
    """The fixed chains' acceptance by depth per prompt kind, next to the controller's single α (its mean)."""
    fixed = [m for m in ("ours/static-4", "ours/adaedl-8", "ours/lookup-10") if any(r["method"] == m for r in
                                                                                     result["records"])]
    if not fixed:
        return []
    kinds = sorted({r["prompt_kind"] for r in result["records"]}, key=report._kind_order)
    lines = ["", "Acceptance by depth at T 0 (greedy chains of the fixed presets: P(draft k accepted | 1..k−1 were)):",
             "", "| method | kind | k 1 | 2 | 3 | 4 | 5 | 6 |", "|---|---|---|---|---|---|---|---|"]
    for method in fixed:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="qwen2.5-coder-1.5b", reps=3, stem="controller")
    parser.add_argument("--tune-per-kind", type=int, default=1, help="tuning prompts per kind for HF's grid")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--no-tune", action="store_true", help="use transformers' defaults as the 'tuned' setting")
    parser.add_argument("--methods", default=None, help="only these method keys, comma-separated (e.g. "
                        "ours/baseline,ours/chain-cost,ours/static-4): a focused re-run; the baseline is always kept")
    args = parser.parse_args(argv)
    log = print
    threads = set_threads(args.threads)
    began = time.monotonic()
    models, draft_name = cli.load_pair(args.target)
    curves = {role: costs.measure(lm, refresh=True).to_dict() for role, lm in models.items()}
    tuned = dict(peers.ASSISTED_DEFAULTS) if args.no_tune or not draft_name else \
        tune_assisted(models, args, log)["settings"]
    prompts = load_prompts(args.per_kind, cli.kinds(args))
    methods = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        methods += pair_methods(tuned, temperature) if draft_name else single_methods(temperature)
    if args.methods:
        keep = {"ours/baseline", *(k.strip() for k in args.methods.split(","))}
        methods = [m for m in methods if m.key.split("@")[0] in keep]
    records = run_suite(methods, models, prompts, args.reps, args.max_new_tokens, log=log)
    result = {"settings": {"target": args.target, "draft": draft_name, "prompts": len(prompts), "reps": args.reps,
                           "max_new_tokens": args.max_new_tokens, "threads": threads, "machine": machine(),
                           "torch": torch.__version__, "platform": platform.platform(),
                           "command": cli.command("python -m bench.controller", argv),
                           "minutes": (time.monotonic() - began) / 60},
              "costs": curves, "assisted_tuned": tuned, "rows": rows(records, methods), "records": records}
    cli.write(cli.out_stem(args), result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
