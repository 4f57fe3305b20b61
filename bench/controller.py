"""The cost-aware draft controller against transformers' best and SpecLab's fixed presets, same run, same kernels,
same draft.

    python -m bench.controller --target qwen2.5-coder-1.5b   # the pair: draft-model chains and trees
    python -m bench.controller --target smollm2-135m         # prompt lookup, layer skip, EAGLE-head trees

1. This machine's cost curves (decoders/costs.py, 5 interleaved repetitions, monotone), target and draft.
2. transformers' assisted generation tuned on the TUNING prompts (a grid of assistant tokens × confidence threshold ×
   schedule, bench/tuning.py), never on a scored prompt, once per draft precision on that very draft.
3. Every method on every scored prompt (ShareGPT chat, HumanEval writing and editing) × repetitions, interleaved, at
   temperature 0 and 1: SpecLab's baseline, the controller (chain and tree), SpecLab's fixed presets, transformers'
   greedy / assisted (its defaults and the tuned setting) / prompt lookup, all on SpecLab's packed kernels.
Equal terms: every draft-model arm runs once per draft precision (--draft-quants, default int8 and float32), and
transformers' assisted arms of a precision are handed the very same draft object as SpecLab's (bench/runner.py
run_draft); the table sets each arm beside transformers' arm on its own draft and names the draft of both.
Speeds use the clock's steady reading for both sides (decoders/clock.py); a ratio is the median over prompts of the
per-repetition paired ratio. Writes bench/results/controller-<target>.{json,md} (bench/controller_report.py).

The focused equal-terms re-run (the controller's best chain and tree against transformers, both precisions):
    python -m bench.controller --target qwen2.5-coder-1.5b --methods equal-terms --out FILE
"""
from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace

import torch

from decoders import costs
from decoders.controller import TREE_BOUNDS

from . import cli, peers, tuning
from .common import LoadMeter, load_prompts, machine
from .controller_report import acceptance_by_depth, depth_lines, markdown, rows  # noqa: F401  (the tables)
from .runner import Method, hf, ours, run_suite, set_threads

COST = dict(controller="cost")
TAG = {"int8": "int8", "none": "f32", "auto": "auto"}  # a draft precision's suffix in the arms' keys
# The focused re-run that puts the headline on equal terms: the controller's chain and tree, and transformers'
# assisted generation at its defaults and tuned, each on the int8 and on the float32 draft.
EQUAL_TERMS = ("ours/chain-cost", "ours/tree-cost", "hf/assisted-defaults", "hf/assisted-tuned")


def pair_methods(assisted_tuned: dict, temperature: float, draft_quants=("int8", "none")) -> list[Method]:
    """The Qwen pair: chains and trees grown by the 0.5B draft model, once per draft precision, each precision's
    transformers arms on the same draft. assisted_tuned: draft_quant -> HF's tuned setting (missing or None: not
    tuned, so no "tuned" arm for that precision)."""
    t = {"temperature": temperature} if temperature else {}
    base = [ours("ours/baseline", "SpecLab baseline", "baseline", **t),
            hf("hf/greedy", "transformers greedy" + (" (sampling)" if temperature else ""), "baseline", "packed",
               temperature=temperature)]
    for quant in draft_quants:
        base += draft_arms(quant, assisted_tuned.get(quant), temperature)
    if not temperature:
        base += [ours(f"ours/eagle2-paper-{TAG[draft_quants[0]]}", "SpecLab EAGLE-2 · K10 D6 M59 (paper, fixed); "
                      f"{tuning.QUANT_WORDS[draft_quants[0]]}", "eagle2", tree_k=10, tree_depth=6, tree_m=59,
                      draft_quant=draft_quants[0]),
                 ours("ours/lookup-cost", "SpecLab prompt lookup · cost-aware length (controller)", "prompt-lookup",
                      rule="static", **COST),
                 tuning.hf_prompt_lookup("hf/prompt-lookup", dict(peers.PROMPT_LOOKUP_DEFAULTS), "packed")]
    return [_sampled(m, temperature) for m in base]


def draft_arms(quant: str, tuned: dict | None, temperature: float) -> list[Method]:
    """Every draft-model arm on one draft precision: SpecLab's controller (chain, tree) and fixed presets, and
    transformers' assisted generation handed the same draft, at its defaults and (where tuned) its best setting."""
    t = {"temperature": temperature} if temperature else {}
    tag, words = TAG[quant], tuning.QUANT_WORDS[quant]
    arms = [ours(f"ours/chain-cost-{tag}", f"SpecLab draft model · AdaEDL · cost-aware cap (controller); {words}",
                 "draft-model", rule="adaedl", draft_quant=quant, **COST, **t),
            ours(f"ours/tree-cost-{tag}", f"SpecLab EAGLE-2 tree · cost-aware (controller); {words}", "eagle2",
                 draft_quant=quant, **TREE_BOUNDS, **COST, **t),
            ours(f"ours/adaedl-8-{tag}", f"SpecLab draft model · AdaEDL L_max 8 (fixed); {words}", "draft-model",
                 rule="adaedl", max_draft=8, draft_quant=quant, **t),
            ours(f"ours/static-4-{tag}", f"SpecLab draft model · static γ=4 (fixed); {words}", "draft-model",
                 rule="static", gamma=4, draft_quant=quant, **t),
            tuning.hf_assisted(f"hf/assisted-defaults-{tag}", dict(peers.ASSISTED_DEFAULTS), "packed", quant)]
    if tuned:
        arms.append(tuning.hf_assisted(f"hf/assisted-tuned-{tag}", tuned, "packed", quant))
    return arms


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
    """At T > 0 every key ends in @t1 (its baseline's has the same suffix); HF methods carry the temperature as a
    Method field (ours already have it in their options)."""
    if not temperature:
        return method
    key = method.key if method.key.endswith("@t1") else method.key + "@t1"
    if method.family == "hf" and not method.temperature:
        return replace(method, key=key, label=method.label + " (sampling)", temperature=temperature)
    return replace(method, key=key)


def tune_assisted(models: dict, args, draft_quants, log) -> dict:
    """draft_quant -> transformers' best assisted setting on the tuning prompts with that draft (paired with
    SpecLab's baseline), for each precision whose tuned arm this run scores."""
    prompts = load_prompts(args.tune_per_kind, cli.kinds(args), split="tuning")
    groups = [tuning.assisted_group(quant) for quant in draft_quants]
    decisions, _ = tuning.run_tuning(groups, models, prompts,
                                     argparse.Namespace(tune_reps=1, tune_max_new=args.max_new_tokens), log)
    return {quant: decisions[group.key]["settings"] for quant, group in zip(draft_quants, groups)}


def wanted(methods: list[Method], names: str | None) -> list[Method]:
    """--methods: the arms whose key, without its draft and temperature suffixes, is named (ours/chain-cost keeps
    ours/chain-cost-int8 and ours/chain-cost-f32), or the EQUAL_TERMS set; the baselines always stay."""
    if not names:
        return methods
    keep = {"ours/baseline", *(k.strip() for k in names.split(","))}
    if "equal-terms" in keep:
        keep |= set(EQUAL_TERMS)
    return [m for m in methods if m.key.split("@")[0] in keep or _undrafted(m.key) in keep]


def _undrafted(key: str) -> str:
    base = key.split("@")[0]
    return next((base.removesuffix("-" + tag) for tag in TAG.values() if base.endswith("-" + tag)), base)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="qwen2.5-coder-1.5b", reps=3, stem="controller")
    parser.add_argument("--tune-per-kind", type=int, default=1, help="tuning prompts per kind for HF's grid")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--draft-quants", default="int8,none",
                        help="the draft precisions every draft-model arm runs with, SpecLab's and transformers' on "
                             "the same draft object: int8, none (float32), auto")
    parser.add_argument("--no-tune", action="store_true",
                        help="no tuning: transformers' assisted generation runs at its defaults only")
    parser.add_argument("--methods", default=None, help="only these method keys, comma-separated, with or without "
                        "their draft suffix (ours/chain-cost = ours/chain-cost-int8 and -f32), or equal-terms "
                        f"({', '.join(EQUAL_TERMS)}): a focused re-run; the baselines are always kept")
    args = parser.parse_args(argv)
    quants = [q.strip() for q in args.draft_quants.split(",") if q.strip()]
    if not quants or set(quants) - set(TAG):
        parser.error(f"--draft-quants takes a comma list of {', '.join(TAG)}; got {args.draft_quants!r}")
    threads = set_threads(args.threads)
    began, load = time.monotonic(), LoadMeter().start()
    models, draft_name = cli.load_pair(args.target)
    curves = {role: costs.measure(lm, refresh=True).to_dict() for role, lm in models.items()}
    temperatures = [float(t) for t in args.temperatures.split(",")]

    def arms(tuned: dict) -> list[Method]:
        methods = []
        for temperature in temperatures:
            methods += pair_methods(tuned, temperature, quants) if draft_name else single_methods(temperature)
        return wanted(methods, args.methods)

    scored = {m.key.split("@")[0] for m in arms({q: dict(peers.ASSISTED_DEFAULTS) for q in quants})}
    to_tune = [] if args.no_tune or not draft_name else [q for q in quants if f"hf/assisted-tuned-{TAG[q]}" in scored]
    tuned = tune_assisted(models, args, to_tune, print) if to_tune else {}
    methods, prompts = arms(tuned), load_prompts(args.per_kind, cli.kinds(args))
    records = run_suite(methods, models, prompts, args.reps, args.max_new_tokens, log=print)
    result = {"settings": {"target": args.target, "draft": draft_name, "prompts": len(prompts), "reps": args.reps,
                           "max_new_tokens": args.max_new_tokens, "threads": threads, "machine": machine(),
                           "torch": torch.__version__, "platform": platform.platform(),
                           "command": cli.command("python -m bench.controller", argv), "draft_quants": quants,
                           "minutes": (time.monotonic() - began) / 60, "load": load.stop()},
              "costs": curves, "assisted_tuned": tuned, "rows": rows(records, [m.key for m in methods]),
              "records": records}
    cli.write(cli.out_stem(args), result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
