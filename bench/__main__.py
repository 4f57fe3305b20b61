"""python -m bench --quick | --pair   (see bench/README.md)

--quick  SmolLM2-135M: SpecLab baseline, prompt lookup, layer skip; HF greedy and HF prompt lookup (a minute or two)
--pair   Qwen2.5-Coder-1.5B target + 0.5B draft: SpecLab baseline, draft model, prompt lookup and the HF peers,
         float32 and bfloat16, plus the temperature-1 draft-length sweep (static γ ∈ {1,2,4,8} vs AdaEDL)
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

from decoders import kernels

from . import costs as cost_model
from . import report
from .runner import (Method, Prompt, available_gib, describe, free_models, hf, ours, run_suite, set_threads,
                     use_kernels)

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets" / "bench"
RESULTS = Path(__file__).resolve().parent / "results"
KIND_FILES = {"code-writing": "code_writing.json", "code-editing": "code_editing.json", "chat": "chat.json"}

# GiB the loaded models need (measured, docs/shared models.md), plus a margin for activations and the harness.
MEMORY_GIB = {("qwen2.5-coder-1.5b", "float32"): 10.4, ("qwen2.5-coder-1.5b", "bfloat16"): 6.2,
              ("smollm2-135m", "float32"): 0.9, ("smollm2-135m", "bfloat16"): 0.6}
MARGIN_GIB = 1.5

PRESETS = {
    "quick": {"target": "smollm2-135m", "draft": None, "dtypes": ["float32"], "reps": 2, "max_new_tokens": 48,
              "per_kind": 1, "sweep": False, "curve_ns": cost_model.QUICK_NS, "curve_repeats": 3,
              "baseline_norec": True, "kernel_controls": True},
    "pair": {"target": "qwen2.5-coder-1.5b", "draft": "qwen2.5-coder-0.5b", "dtypes": ["float32", "bfloat16"],
             "reps": 2, "max_new_tokens": 128, "per_kind": 1, "sweep": True, "curve_ns": cost_model.QUICK_NS,
             "curve_repeats": 3, "baseline_norec": False, "kernel_controls": True},
}


def load_prompts(per_kind: int, kinds=None) -> list[Prompt]:
    prompts = []
    for kind, name in KIND_FILES.items():
        if kinds and kind not in kinds:
            continue
        data = json.loads((ASSETS / name).read_text())
        for entry in data["prompts"][:per_kind]:
            prompts.append(Prompt(entry["id"], data["kind"], entry["text"]))
    return prompts


def methods_for(preset: str, args) -> list[Method]:
    pl = {"gamma": args.pl_gamma, "ngram": args.pl_ngram}
    chosen = [ours("ours/baseline", "SpecLab baseline", "baseline", peer="hf/greedy")]
    if PRESETS[preset]["baseline_norec"]:
        chosen.append(ours("ours/baseline" + report.NOREC, "SpecLab baseline, no trace", "baseline", record=False))
    chosen += [ours("ours/prompt-lookup", "SpecLab prompt lookup", "prompt-lookup", peer="hf/prompt-lookup", **pl),
              ours("ours/prompt-lookup" + report.NOREC, "SpecLab prompt lookup, no trace", "prompt-lookup",
                   record=False, **pl)]
    if preset == "quick":
        chosen.append(ours("ours/layer-skip", "SpecLab layer skip (static γ=2)", "layer-skip", gamma=2))
    if args.draft:
        dm = {"rule": args.draft_rule, "gamma": args.draft_gamma, "max_draft": args.max_draft}
        if args.draft_lam is not None:
            dm["lam"] = args.draft_lam
        label = f"SpecLab draft model ({_rule_label(dm)})"
        chosen += [ours("ours/draft-model", label, "draft-model", peer="hf/assisted", **dm),
                   ours("ours/draft-model" + report.NOREC, label + ", no trace", "draft-model", record=False, **dm)]
    chosen += [hf("hf/greedy", "HF generate greedy", "baseline"),
               hf("hf/prompt-lookup", "HF prompt lookup (10 tokens)", "prompt-lookup")]
    if args.draft:
        chosen.append(hf("hf/assisted", "HF assisted generation", "draft-model"))
    if PRESETS[preset]["kernel_controls"] if args.kernel_controls is None else args.kernel_controls:
        # Controls that split a ratio into "kernels" and "algorithm": our baseline on stock kernels, and HF's own
        # method on SpecLab's packed kernels (decoders/kernels.py).
        chosen.append(ours("ours/baseline@stock", "SpecLab baseline, stock kernels", "baseline", kernels="stock"))
        if args.draft:
            chosen.append(hf("hf/assisted@packed", "HF assisted generation, packed kernels", "draft-model",
                             kernels="packed"))
        else:
            chosen.append(hf("hf/prompt-lookup@packed", "HF prompt lookup (10 tokens), packed kernels",
                             "prompt-lookup", kernels="packed"))
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [m for m in chosen if m.key in wanted or m.key in ("ours/baseline",)]
    return chosen


def sweep_methods(args) -> list[Method]:
    out = [ours(f"ours/t1/static-g{g}", f"SpecLab draft model T=1, static γ={g}", "draft-model", temperature=1.0,
                rule="static", gamma=g) for g in (1, 2, 4, 8)]
    out.append(ours("ours/t1/adaedl", f"SpecLab draft model T=1, AdaEDL (L_max={args.sweep_max_draft})",
                    "draft-model", temperature=1.0, rule="adaedl", max_draft=args.sweep_max_draft))
    return out


def _rule_label(dm: dict) -> str:
    if dm["rule"] == "static":
        return f"static γ={dm['gamma']}"
    return f"{dm['rule']}, L_max={dm['max_draft']}" + (f", λ={dm['lam']}" if "lam" in dm else "")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}"


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
    from decoders.models import load_model

    return load_model(name, dtype=dtype)


def run(args, loader=default_loader, log=print) -> dict:
    preset = PRESETS[args.preset]
    threads = set_threads(args.threads)
    dtypes = args.dtypes.split(",") if args.dtypes else preset["dtypes"]
    reps = args.reps or preset["reps"]
    max_new = args.max_new_tokens or preset["max_new_tokens"]
    prompts_all = load_prompts(args.per_kind or preset["per_kind"], args.kinds.split(",") if args.kinds else None)
    args.draft = preset["draft"] if args.draft is None else (args.draft or None)
    methods = methods_for(args.preset, args)
    sweep = sweep_methods(args) if (preset["sweep"] if args.sweep is None else args.sweep) and args.draft else []
    import transformers

    from . import peers

    result = {
        "meta": {"preset": args.preset, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
                 "python": platform.python_version(), "threads": threads, "max_new_tokens": max_new, "reps": reps,
                 "gpu": "none: this machine has no CUDA device" if not torch.cuda.is_available() else "cuda",
                 "timing": "decode-only: from the first delivered batch of tokens to the end of the call, for SpecLab "
                           "(decoders.stream) and HF (a streamer) alike; tokens counted after that first batch",
                 "noise_note": "The machine is shared with other jobs: compare ratios within this run (paired per "
                               "repetition), not absolute tok/s across runs.",
                 "command": " ".join(sys.argv)},
        "peer_settings": {"hf/greedy": peers.peer_settings("greedy"),
                          "hf/prompt-lookup": peers.peer_settings("prompt-lookup")},
        "methods": [describe(m) for m in methods + sweep],
        "runs": {},
    }
    for dtype in dtypes:
        log(f"== {args.preset}: {dtype} ==")
        models = {}
        need = MEMORY_GIB.get((preset["target"], dtype), 0) + (MEMORY_GIB.get((preset["draft"], dtype), 3)
                                                               if args.draft else 0)
        wait_for_memory(need, log) if need else None
        t0 = time.perf_counter()
        models["target"] = loader(preset["target"], dtype)
        if args.draft:
            models["draft"] = loader(args.draft, dtype)
        log(f"  loaded in {time.perf_counter() - t0:.0f} s; {available_gib():.1f} GiB left")
        if args.draft:
            result["peer_settings"]["hf/assisted"] = peers.peer_settings("assisted", models["draft"].model)
        prompts = [Prompt(p.id, p.kind, p.text) for p in prompts_all]
        for p in prompts:
            p.ids = models["target"].encode_prompt(p.text, chat=True)
        run_data = {"models": {k: getattr(v, "name", k) for k, v in models.items()}, "dtype": dtype, "costs": {}}
        if not args.no_costs:
            ns = tuple(int(n) for n in args.curve_ns.split(",")) if args.curve_ns else tuple(preset["curve_ns"])
            for kind, suffix in (("packed", ""), ("stock", "_stock")):  # "" = as SpecLab runs (packed where it can)
                use_kernels(models, kind)
                if kind == "packed":
                    run_data["costs"]["packed"] = kernels.kernels_of(models["target"].model) == kernels.PACKED
                elif not run_data["costs"]["packed"]:
                    break  # nothing packs here (bfloat16, GPU): the first curve already is the stock one
                log(f"  cost curve t(n), {kind} kernels ...")
                run_data["costs"]["target_curve" + suffix] = cost_model.forward_cost_curve(
                    models["target"].model, prompts[0].ids, ns, args.curve_repeats or preset["curve_repeats"])
                if args.draft:
                    run_data["costs"]["draft" + suffix] = cost_model.draft_cost_ratio(
                        models["target"].model, models["draft"].model, prompts[0].ids)
        partial = Path(args.out) / f"{args.stem or args.preset}.partial.json"

        def save_partial(done, earlier=()):
            partial.parent.mkdir(parents=True, exist_ok=True)
            run_data["records"] = list(earlier) + list(done)
            result["runs"][dtype] = run_data
            partial.write_text(json.dumps(result, default=str))

        records = run_suite(methods, models, prompts, reps, max_new, log=log, on_record=save_partial)
        if sweep and (not args.sweep_dtypes or dtype in args.sweep_dtypes.split(",")):
            code = [p for p in prompts if p.kind in report.CODE_KINDS][: args.sweep_prompts or None]
            log(f"  temperature-1 sweep on {len(code)} code prompts ...")
            first = list(records)
            records += run_suite(sweep + [m for m in methods if m.key == "ours/baseline"], models, code,
                                 args.sweep_reps or reps, max_new, log=log,
                                 on_record=lambda done: save_partial(done, first))
        run_data["records"] = records
        run_data["prompt_texts"] = {p.id: p.text for p in prompts}
        result["runs"][dtype] = run_data
        free_models(models)
    return report.finish(result)


def parse(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="preset", action="store_const", const="quick")
    group.add_argument("--pair", dest="preset", action="store_const", const="pair")
    parser.add_argument("--dtypes", help="comma list, e.g. float32,bfloat16 (default: the preset's)")
    parser.add_argument("--reps", type=int, help="repetitions (default: the preset's)")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--per-kind", type=int, help="prompts per kind (default: the preset's)")
    parser.add_argument("--kinds", help="comma list of prompt kinds: code-writing,code-editing,chat")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")
    parser.add_argument("--draft", default=None, help="draft model name ('' for none; default: the preset's)")
    parser.add_argument("--draft-rule", default="adaedl", choices=["static", "heuristic", "max-confidence",
                                                                          "adaedl"])
    parser.add_argument("--draft-gamma", type=int, default=4)
    parser.add_argument("--max-draft", type=int, default=12)
    parser.add_argument("--draft-lam", type=float, default=None)
    parser.add_argument("--pl-gamma", type=int, default=10, help="SpecLab prompt lookup: tokens per match")
    parser.add_argument("--pl-ngram", type=int, default=3)
    parser.add_argument("--sweep", dest="sweep", action="store_true", default=None)
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument("--sweep-reps", type=int, default=None)
    parser.add_argument("--sweep-max-draft", type=int, default=12)
    parser.add_argument("--sweep-dtypes", default=None, help="run the T=1 sweep only for these dtypes (comma list)")
    parser.add_argument("--sweep-prompts", type=int, default=None, help="code prompts in the T=1 sweep (default all)")
    parser.add_argument("--no-costs", action="store_true")
    parser.add_argument("--curve-ns", default=None, help="comma list of n for t(n) (default: the preset's)")
    parser.add_argument("--curve-repeats", type=int, default=None)
    parser.add_argument("--kernel-controls", dest="kernel_controls", action="store_true", default=None,
                        help="also run our baseline on stock kernels and HF's method on packed kernels")
    parser.add_argument("--no-kernel-controls", dest="kernel_controls", action="store_false")
    parser.add_argument("--only", help="comma list of method keys to run (ours/baseline always runs)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--report-only", metavar="JSON", help="no runs: rebuild the tables and chart from a saved "
                        "result (e.g. a <stem>.partial.json left by a stopped run)")
    parser.add_argument("--stem", default=None, help="output file stem (default: the preset name)")
    args = parser.parse_args(argv)
    args.preset = args.preset or "quick"
    return args


def rebuild(path: Path) -> dict:
    """Tables from a saved (possibly partial) result JSON: re-mark identity, recompute every summary."""
    from .runner import mark_identity

    result = json.loads(Path(path).read_text())
    for run_data in result["runs"].values():
        mark_identity(run_data["records"])
    return report.finish(result)


def main(argv=None, loader=default_loader) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse(argv)
    result = rebuild(Path(args.report_only)) if args.report_only else run(args, loader=loader)
    paths = report.write(result, Path(args.out), args.stem or args.preset)
    (Path(args.out) / f"{args.stem or args.preset}.partial.json").unlink(missing_ok=True)
    print()
    print(report.markdown(result))
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return result


if __name__ == "__main__":
    main()
