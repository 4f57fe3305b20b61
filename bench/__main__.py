"""python -m bench --quick | --pair   (see bench/README.md)

--quick  SmolLM2-135M: SpecLab baseline, prompt lookup, layer skip; HF greedy and HF prompt lookup (minutes)
--pair   Qwen2.5-Coder-1.5B target + 0.5B draft, float32: SpecLab baseline, draft model, prompt lookup against HF
         greedy, assisted generation and prompt lookup, each HF peer on SpecLab's packed kernels (the headline) and
         on stock kernels (as users run HF); every side's settings tuned first on prompts that are not scored;
         then the temperature-1 draft-length sweep (static γ ∈ {1,2,4,8} vs AdaEDL). Hours: the estimate is
         printed before anything loads; bench/README.md has the reduced-run flags.
Results go to bench/results/<preset>.{json,md,png}; the markdown table is printed last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from decoders.runtime import kernels

from . import costs as cost_model
from . import peers, report, tuning
from .common import ASSETS, KIND_FILES, NOREC, RESULTS, LoadMeter, Prompt, load_prompts, machine
from .runner import HF_KIND, Method, available_gib, describe, free_models, hf, ours, run_suite, set_threads, use_kernels
from .tuning import run_tuning

# GiB the loaded models need (measured on a 2-core CPU: both Qwen models in memory peak at 10.4 GiB in float32, 6.2 in
# bfloat16; docs/models.md), plus a margin for activations and the harness.
MEMORY_GIB = {("qwen2.5-coder-1.5b", "float32"): 10.4, ("qwen2.5-coder-1.5b", "bfloat16"): 6.2,
              ("smollm2-135m", "float32"): 0.9, ("smollm2-135m", "bfloat16"): 0.6}
MARGIN_GIB = 1.5

PRESETS = {
    "quick": {"target": "smollm2-135m", "draft": None, "dtypes": ["float32"], "reps": 2, "max_new_tokens": 48,
              "per_kind": 2, "sweep": False, "sweep_per_kind": 1, "curve_ns": cost_model.QUICK_NS,
              "curve_repeats": 3, "trace_twins": True, "kernel_controls": True, "stock_peers": True,
              "tune": True, "tune_per_kind": 1, "tune_reps": 1, "tune_max_new_tokens": 32},
    # bfloat16 is left out by default: nothing packs in bf16 here, so it has no equal-kernel headline, and it
    # loses to float32 on this CPU (bench/OPTIMIZATIONS.md §6); --dtypes float32,bfloat16 adds it.
    "pair": {"target": "qwen2.5-coder-1.5b", "draft": "qwen2.5-coder-0.5b", "dtypes": ["float32"], "reps": 3,
             "max_new_tokens": 128, "per_kind": 5, "sweep": True, "sweep_per_kind": 1, "curve_ns": cost_model.QUICK_NS,
             "curve_repeats": 3, "trace_twins": False, "kernel_controls": False, "stock_peers": True,
             "tune": True, "tune_per_kind": 1, "tune_reps": 1, "tune_max_new_tokens": 64},
}
# Rough cost of one run on a quiet 2-core machine, for the estimate printed before a run: seconds of prefill and
# setup, then seconds per new token on packed / stock kernels (medians of bench/results/pair-f32-packed.json and
# quick.json, with the longer HumanEval/ShareGPT prompts' prefill).
RUN_COST = {"pair": {"setup": 6.0, "packed": 0.13, "stock": 0.25, "load": 120.0, "costs": 240.0},
            "quick": {"setup": 0.4, "packed": 0.035, "stock": 0.05, "load": 15.0, "costs": 20.0}}


def first_per_kind(prompts: list[Prompt], n: int) -> list[Prompt]:
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        seen[p.kind] = seen.get(p.kind, 0) + 1
        if seen[p.kind] <= n:
            out.append(p)
    return out


def default_settings(args) -> dict[str, dict]:
    """Each tunable method's settings when nothing is tuned (--no-tune): the flags, and HF's own defaults."""
    dm = {"rule": args.draft_rule, "max_draft": args.max_draft} if args.draft_rule != "static" else \
        {"rule": "static", "gamma": args.draft_gamma}
    if args.draft_rule == "heuristic":
        dm["gamma"] = args.draft_gamma
    if args.draft_lam is not None:
        dm["lam"] = args.draft_lam
    out = {"ours/prompt-lookup": {"rule": "static", "gamma": args.pl_gamma, "ngram": args.pl_ngram},
           "hf/prompt-lookup": {"prompt_lookup_num_tokens": args.pl_gamma, "max_matching_ngram_size": args.pl_ngram},
           "ours/t1/adaedl": {"max_draft": args.sweep_max_draft}}
    for quant in args.draft_quants:
        out[tuning.quant_key("ours/draft-model", quant)] = dict(dm)
        out[tuning.quant_key("hf/assisted", quant)] = dict(peers.ASSISTED_DEFAULTS)
    return out


def methods_for(preset: str, args, settings: dict[str, dict]) -> list[Method]:
    """The scored methods. Each SpecLab method's headline peer is HF's method on the same packed kernels; its
    second peer is the same HF method on stock kernels (as users run HF)."""
    options = PRESETS[preset]
    twins = options["trace_twins"] if args.trace_twins is None else args.trace_twins
    stock = options["stock_peers"] if args.stock_peers is None else args.stock_peers

    def peers_of(hf_key):
        return {"peer": hf_key + "@packed", "peer_stock": hf_key if stock else None}

    chosen = [ours("ours/baseline", "SpecLab baseline", "baseline", **peers_of("hf/greedy"))]
    if twins:
        chosen.append(ours("ours/baseline" + NOREC, "SpecLab baseline", "baseline", record=False))
    pl = settings["ours/prompt-lookup"]
    chosen.append(tuning.ours_prompt_lookup("ours/prompt-lookup", pl, **peers_of("hf/prompt-lookup")))
    if twins:
        chosen.append(tuning.ours_prompt_lookup("ours/prompt-lookup" + NOREC, pl, record=False))
    if preset == "quick":
        chosen.append(ours("ours/layer-skip", "SpecLab layer skip (static γ=2)", "layer-skip", gamma=2))
    for quant in args.draft_quants if args.draft else ():  # each precision: SpecLab's and HF's arm on one draft
        key = tuning.quant_key("ours/draft-model", quant)
        dm = settings[key]
        chosen.append(tuning.ours_draft_model(key, dm, draft_quant=quant,
                                              **peers_of(tuning.quant_key("hf/assisted", quant))))
        if twins:
            chosen.append(tuning.ours_draft_model(key + NOREC, dm, draft_quant=quant, record=False))
    kernel_kinds = ("packed", "stock") if stock else ("packed",)
    for kind in kernel_kinds:
        suffix = "@packed" if kind == "packed" else ""
        where = "packed kernels" if kind == "packed" else "stock kernels, as users run it"
        chosen.append(hf("hf/greedy" + suffix, f"HF generate greedy ({where})", "baseline", kind))
        chosen.append(tuning.hf_prompt_lookup("hf/prompt-lookup" + suffix, settings["hf/prompt-lookup"], kind))
        for quant in args.draft_quants if args.draft else ():
            key = tuning.quant_key("hf/assisted", quant)
            chosen.append(tuning.hf_assisted(key + suffix, settings[key], kind, quant))
    if options["kernel_controls"] if args.kernel_controls is None else args.kernel_controls:
        # splits "SpecLab vs HF as users run it" into kernels and everything else
        chosen.append(ours("ours/baseline@stock", "SpecLab baseline, stock kernels", "baseline", kernels="stock"))
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [m for m in chosen if m.key in wanted or m.key in ("ours/baseline",)]
    return chosen


def sweep_methods(args, settings: dict[str, dict]) -> list[Method]:
    out = [ours(f"ours/t1/static-g{g}", f"SpecLab draft model T=1, static γ={g}", "draft-model", temperature=1.0,
                rule="static", gamma=g) for g in (1, 2, 4, 8)]
    out.append(tuning.ours_t1_adaedl("ours/t1/adaedl", settings["ours/t1/adaedl"]))
    return out


def tuned_groups(args, methods: list[Method], sweep: list[Method]) -> list[tuning.Group]:
    """The grids of the tunable methods that this run scores."""
    if not args.tune_on:
        return []
    scored = {m.key.split("@")[0] for m in methods + sweep}
    return [g for g in tuning.groups(args, bool(args.draft)) if g.key in scored]


def estimate_seconds(preset: str, plan: list[tuple[Method, int, int]], dtypes: int) -> float:
    """plan: (method, runs, max_new_tokens) -> rough wall seconds on a quiet machine (RUN_COST)."""
    cost = RUN_COST[preset]
    runs = sum(n * (cost["setup"] + max_new * cost["stock" if m.kernels == "stock" else "packed"])
               for m, n, max_new in plan)
    return dtypes * (runs + cost["load"] + cost["costs"])


def wait_for_memory(need: float, log, patience_s: float = 600) -> None:
    """Refuse to load a model that does not fit: wait (other jobs may finish) and then give up with a message."""
    deadline = time.time() + patience_s
    while available_gib() < need + MARGIN_GIB:
        if time.time() > deadline:
            raise SystemExit(f"not enough free memory: {available_gib():.1f} GiB available, {need + MARGIN_GIB:.1f} "
                             "GiB needed; close other model-loading jobs and retry")
        log(f"  waiting for memory: {available_gib():.1f} GiB available, {need + MARGIN_GIB:.1f} GiB needed")
        time.sleep(20)


def default_loader(name: str, dtype: str):
    from decoders.runtime.models import load_model

    return load_model(name, dtype=dtype)


def run(args, loader=default_loader, log=print) -> dict | None:
    preset = PRESETS[args.preset]
    threads = set_threads(args.threads)
    dtypes = args.dtypes.split(",") if args.dtypes else preset["dtypes"]
    reps = args.reps or preset["reps"]
    max_new = args.max_new_tokens or preset["max_new_tokens"]
    kinds = args.kinds.split(",") if args.kinds else None
    prompts_all = load_prompts(args.per_kind or preset["per_kind"], kinds)
    args.draft = preset["draft"] if args.draft is None else (args.draft or None)
    args.sweep_on = bool((preset["sweep"] if args.sweep is None else args.sweep) and args.draft)
    args.tune_on = preset["tune"] if args.tune is None else args.tune
    args.tune_reps = args.tune_reps or preset["tune_reps"]
    args.tune_max_new = args.tune_max_new_tokens or preset["tune_max_new_tokens"]
    tune_prompts_all = load_prompts(args.tune_per_kind or preset["tune_per_kind"], kinds, split="tuning")
    sweep_per_kind = args.sweep_per_kind or preset["sweep_per_kind"]
    settings = default_settings(args)
    methods = methods_for(args.preset, args, settings)
    sweep = sweep_methods(args, settings) if args.sweep_on else []
    groups = tuned_groups(args, methods, sweep)
    import transformers

    sweep_prompts = first_per_kind([p for p in prompts_all if p.kind in report.CODE_KINDS], sweep_per_kind)
    sweep_reps = args.sweep_reps or reps
    plan = [(m, reps * len(prompts_all), max_new) for m in methods]
    plan += [(m, sweep_reps * len(sweep_prompts), max_new) for m in sweep + methods[:1]]
    plan += [(m, args.tune_reps * len([p for p in tune_prompts_all if g.kinds is None or p.kind in g.kinds]),
              args.tune_max_new) for g in groups for m in g.candidates()]
    runs = sum(n for _, n, _ in plan)
    log(f"== {args.preset}: {len(methods)} methods x {len(prompts_all)} prompts x {reps} repetitions"
        + (f", T=1 sweep on {len(sweep_prompts)} prompts" if sweep else "")
        + (f", tuning {sum(len(g.grid) for g in groups)} settings on {len(tune_prompts_all)} prompts" if groups else "")
        + f": {runs} runs, about {estimate_seconds(args.preset, plan, len(dtypes)) / 3600:.1f} h on a quiet "
        "2-core machine (longer under load) ==")
    if args.dry_run:
        return None
    result = {
        "meta": {"preset": args.preset, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
                 "python": platform.python_version(), "threads": threads, "max_new_tokens": max_new, "reps": reps,
                 "gpu": "none: this machine has no CUDA device" if not torch.cuda.is_available() else "cuda",
                 "timing": "decode-only: from the first delivered batch of tokens to the end of the call, for SpecLab "
                           "(decoders.stream) and HF (a streamer) alike; tokens counted after that first batch",
                 "tau": report.TAU_RULE,
                 "noise_note": "",  # written after the run, from the load measured during it
                 "prompt_sets": {kind: json.loads((ASSETS / name).read_text(encoding="utf-8"))["provenance"]
                                 for kind, name in KIND_FILES.items() if not kinds or kind in kinds},
                 "command": " ".join(sys.argv)},
        "methods": [describe(m) for m in methods + sweep],
        "runs": {},
    }
    load = LoadMeter().start()
    for dtype in dtypes:
        log(f"== {args.preset}: {dtype} ==")
        models = {}
        need = MEMORY_GIB.get((preset["target"], dtype), 0) + (MEMORY_GIB.get((preset["draft"], dtype), 3)
                                                               if args.draft else 0)
        if need and loader is default_loader:  # the registry's real weights; a given loader brings its own models
            wait_for_memory(need, log)
        t0 = time.perf_counter()
        models["target"] = loader(preset["target"], dtype)
        if args.draft:
            models["draft"] = loader(args.draft, dtype)
        log(f"  loaded in {time.perf_counter() - t0:.0f} s; {available_gib():.1f} GiB left")
        prompts = [Prompt(p.id, p.kind, p.text) for p in prompts_all]
        tune_prompts = [Prompt(p.id, p.kind, p.text) for p in tune_prompts_all]
        for p in prompts + tune_prompts:
            p.ids = models["target"].encode_prompt(p.text, chat=True)
        run_data = {"models": {k: getattr(v, "name", k) for k, v in models.items()}, "dtype": dtype, "costs": {}}
        if not args.no_costs:
            run_data["costs"] = measure_costs(models, prompts[0].ids, args, preset, log)
        partial = Path(args.out) / f"{args.stem or args.preset}.partial.json"

        def save_partial(done, earlier=()):
            partial.parent.mkdir(parents=True, exist_ok=True)
            run_data["records"] = list(earlier) + list(done)
            result["runs"][dtype] = run_data
            partial.write_text(json.dumps(result, default=str))

        chosen = dict(settings)
        if groups:
            decisions, tune_records = run_tuning(groups, models, tune_prompts, args, log)
            chosen.update({key: d["settings"] for key, d in decisions.items()})
            run_data["tuning"] = {"prompts": {p.id: p.kind for p in tune_prompts}, "reps": args.tune_reps,
                                  "max_new_tokens": args.tune_max_new, "reference": "ours/baseline",
                                  "groups": decisions, "records": tune_records}
            for key, d in decisions.items():
                log(f"  tuned {key}: {d['candidates'][d['chosen']]['label']} (score {d['candidates'][d['chosen']]['score']:.2f})")
        dtype_methods = methods_for(args.preset, args, chosen)
        dtype_sweep = sweep_methods(args, chosen) if sweep else []
        run_data["methods"] = [describe(m) for m in dtype_methods + dtype_sweep]
        run_data["peer_settings"] = {m.key: peers.peer_settings(HF_KIND[m.kind], m.options)
                                     for m in dtype_methods if m.family == "hf"}
        result["methods"] = run_data["methods"]
        records = run_suite(dtype_methods, models, prompts, reps, max_new, log=log, on_record=save_partial)
        if dtype_sweep and (not args.sweep_dtypes or dtype in args.sweep_dtypes.split(",")):
            code = [p for p in prompts if p.id in {q.id for q in sweep_prompts}]
            log(f"  temperature-1 sweep on {len(code)} code prompts ...")
            first = list(records)
            records += run_suite(dtype_sweep + [m for m in dtype_methods if m.key == "ours/baseline"], models, code,
                                 sweep_reps, max_new, log=log,
                                 on_record=lambda done: save_partial(done, first))
        run_data["records"] = records
        run_data["prompt_texts"] = {p.id: p.text for p in prompts + tune_prompts}
        result["runs"][dtype] = run_data
        free_models(models)
    result["meta"]["load"] = load.stop()
    result["meta"]["noise_note"] = noise_note(result["meta"]["load"])
    return report.finish(result)


def noise_note(load: dict) -> str:
    """What the measured load means for reading the tables (bench/common.py LoadMeter)."""
    return (f"Machine during the run: {load['label']}. Compare ratios within this run (paired per repetition), not "
            "absolute tok/s across runs.")


def measure_costs(models: dict, prompt_ids: list[int], args, preset: dict, log) -> dict:
    """t(n) and c on packed and on stock kernels (one curve only where nothing packs: bfloat16, GPU)."""
    ns = tuple(int(n) for n in args.curve_ns.split(",")) if args.curve_ns else tuple(preset["curve_ns"])
    out = {}
    for kind, suffix in (("packed", ""), ("stock", "_stock")):  # "" = as SpecLab runs (packed where it can)
        use_kernels(models, kind)
        if kind == "packed":
            out["packed"] = kernels.kernels_of(models["target"].model) == kernels.PACKED
        elif not out["packed"]:
            break  # nothing packs here: the first curve already is the stock one
        log(f"  cost curve t(n), {kind} kernels ...")
        out["target_curve" + suffix] = cost_model.forward_cost_curve(
            models["target"].model, prompt_ids, ns, args.curve_repeats or preset["curve_repeats"])
        if args.draft:
            out["draft" + suffix] = cost_model.draft_cost_ratio(models["target"].model, models["draft"].model,
                                                                 prompt_ids)
    return out


def parse(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="preset", action="store_const", const="quick")
    group.add_argument("--pair", dest="preset", action="store_const", const="pair")
    parser.add_argument("--dtypes", help="comma list, e.g. float32,bfloat16 (default: the preset's)")
    parser.add_argument("--reps", type=int, help="repetitions (default: the preset's)")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--per-kind", type=int, help="scored prompts per kind (default: the preset's)")
    parser.add_argument("--kinds", help="comma list of prompt kinds: code-writing,code-editing,chat")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")
    parser.add_argument("--draft", default=None, help="draft model name ('' for none; default: the preset's)")
    parser.add_argument("--tune", dest="tune", action="store_true", default=None,
                        help="choose every side's settings on the tuning prompts first (the presets do)")
    parser.add_argument("--no-tune", dest="tune", action="store_false",
                        help="use the flags below and HF's defaults instead of tuning")
    parser.add_argument("--tune-per-kind", type=int, default=None, help="tuning prompts per kind")
    parser.add_argument("--tune-reps", type=int, default=None)
    parser.add_argument("--tune-max-new-tokens", type=int, default=None)
    parser.add_argument("--draft-rule", default="adaedl", choices=["static", "heuristic", "max-confidence",
                                                                          "adaedl"], help="with --no-tune")
    parser.add_argument("--draft-gamma", type=int, default=4, help="with --no-tune")
    parser.add_argument("--max-draft", type=int, default=12, help="with --no-tune")
    parser.add_argument("--draft-lam", type=float, default=None, help="with --no-tune")
    parser.add_argument("--pl-gamma", type=int, default=10, help="prompt lookup tokens per match, both sides "
                        "(with --no-tune)")
    parser.add_argument("--pl-ngram", type=int, default=3, help="prompt lookup n-gram size, both sides (always)")
    parser.add_argument("--stock-peers", dest="stock_peers", action="store_true", default=None,
                        help="also run each HF peer on stock kernels (as users run HF; the presets do)")
    parser.add_argument("--no-stock-peers", dest="stock_peers", action="store_false")
    parser.add_argument("--trace-twins", dest="trace_twins", action="store_true", default=None,
                        help="also run SpecLab methods with recording off (paired trace-cost cross-check)")
    parser.add_argument("--no-trace-twins", dest="trace_twins", action="store_false")
    parser.add_argument("--sweep", dest="sweep", action="store_true", default=None)
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument("--sweep-reps", type=int, default=None)
    parser.add_argument("--sweep-max-draft", type=int, default=12, help="AdaEDL L_max at T=1 (with --no-tune)")
    parser.add_argument("--sweep-dtypes", default=None, help="run the T=1 sweep only for these dtypes (comma list)")
    parser.add_argument("--sweep-per-kind", type=int, default=None, help="scored prompts per code kind in the "
                        "T=1 sweep (default: the preset's)")
    parser.add_argument("--no-costs", action="store_true")
    parser.add_argument("--curve-ns", default=None, help="comma list of n for t(n) (default: the preset's)")
    parser.add_argument("--curve-repeats", type=int, default=None)
    parser.add_argument("--kernel-controls", dest="kernel_controls", action="store_true", default=None,
                        help="also run SpecLab's baseline on stock kernels")
    parser.add_argument("--no-kernel-controls", dest="kernel_controls", action="store_false")
    parser.add_argument("--draft-quants", default="none,int8",
                        help="the draft precisions to compare, comma list of none (float32), int8, auto: each gets a "
                             "SpecLab draft-model arm and an HF assisted arm handed the very same draft object "
                             "(keys ours/draft-model[-int8|-auto], hf/assisted[-int8|-auto])")
    parser.add_argument("--only", help="comma list of method keys to run (ours/baseline always runs)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--report-only", metavar="JSON", help="no runs: rebuild the tables and chart from a saved "
                        "result (e.g. a <stem>.partial.json left by a stopped run)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate, run nothing")
    parser.add_argument("--stem", default=None, help="output file stem (default: the preset name)")
    args = parser.parse_args(argv)
    args.preset = args.preset or "quick"
    args.draft_quants = [q.strip() for q in args.draft_quants.split(",") if q.strip()]
    unknown = set(args.draft_quants) - set(tuning.QUANT_SUFFIX)
    if unknown or not args.draft_quants:
        parser.error(f"--draft-quants takes a comma list of {', '.join(tuning.QUANT_SUFFIX)}; got {args.draft_quants}")
    return args


def rebuild(path: Path) -> dict:
    """Tables from a saved (possibly partial) result JSON: re-mark identity, recompute every summary."""
    from .runner import mark_identity

    result = json.loads(Path(path).read_text())
    for method in [*result.get("methods", []), *(m for r in result["runs"].values() for m in r.get("methods", []))]:
        if method["key"].endswith(NOREC) and "no trace" not in method["label"]:
            method["label"] += ", no trace"  # results saved before twins were named in their label
    for run_data in result["runs"].values():
        mark_identity(run_data["records"])
    return report.finish(result)


def main(argv=None, loader=default_loader) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse(argv)
    result = rebuild(Path(args.report_only)) if args.report_only else run(args, loader=loader)
    if result is None:  # --dry-run
        return {}
    paths = report.write(result, Path(args.out), args.stem or args.preset)
    (Path(args.out) / f"{args.stem or args.preset}.partial.json").unlink(missing_ok=True)
    print()
    print(report.markdown(result))
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return result


if __name__ == "__main__":
    main()
