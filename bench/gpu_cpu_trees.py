"""On the CPU, does a static KV buffer cost anything? bench.trees' methods with each KV cache, in one run.

    python -m bench.gpu_cpu_trees [--per-kind 1] [--reps 2] [--max-new-tokens 48]

Every method of `python -m bench.trees` (SmolLM2-135M with its shipped EAGLE head: the baseline, prompt lookup,
EAGLE's static tree, EAGLE-2 at the paper's shape and cost-aware, DDD) runs three times per prompt and repetition,
interleaved (bench/runner.py): with transformers' DynamicCache, with static buffers read as views (kv_cache
"static") and with fixed-shape buffers at bucketed widths ("fixed", what CUDA graphs replay; eager here). The ratio
is each twin's tokens/s over the DynamicCache twin's of the same prompt and repetition. decoders/runtime/buffers.resolve
keeps "auto" on the DynamicCache on a CPU unless this shows a buffer is not slower. Writes
bench/results/gpu-cpu-trees-<target>.{md,json}.
"""
from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace

import torch

from . import cli, report
from .__main__ import load_prompts
from .runner import Method, run_suite, set_threads
from .trees import methods_for

KINDS = ("dynamic", "static", "fixed")


def twins(methods: list[Method]) -> list[Method]:
    """Each method once per KV cache; the DynamicCache twin keeps the method's own key (the baseline stays
    "ours/baseline", which every identity check reads)."""
    out = []
    for method in methods:
        for kind in KINDS:
            key = method.key if kind == "dynamic" else f"{method.key}@{kind}"
            out.append(replace(method, key=key, label=f"{method.label} · {kind}",
                               options={**method.options, "kv_cache": kind}))
    return out


def rows(records: list[dict], methods: list[Method]) -> list[dict]:
    out = []
    for method in methods:
        row = {"method": method.key, "label": method.label}
        for kind in KINDS:
            key = method.key if kind == "dynamic" else f"{method.key}@{kind}"
            mine = [r for r in records if r["method"] == key]
            same = [r["identical_to_baseline"] for r in mine if r.get("identical_to_baseline") is not None]
            ratio = report.ratio_over(records, key, method.key) if kind != "dynamic" else None
            row[kind] = {"tok_s": report.median([r["tok_s"] for r in mine]), "same": f"{sum(same)}/{len(same)}",
                         "vs_dynamic": ratio["median"] if ratio else None, "spread": ratio["spread"] if ratio else None}
        out.append(row)
    return out


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Static KV buffers on the CPU: bench.trees' methods per KV cache ({s['target']}, float32)", "",
             f"`{s['command']}` · {s['prompts']} prompts × {s['reps']} repetitions × {s['max_new_tokens']} tokens · "
             f"greedy · {s['threads']} threads · {s['machine']} · {s['minutes']:.0f} min · {s['note']}", "",
             "Ratio = median over prompts of the per-repetition tokens/s ratio to the DynamicCache twin of the same "
             "prompt and repetition (range in brackets). Same = outputs equal to the DynamicCache baseline's.", "",
             "| method | DynamicCache tok/s | static tok/s | static ÷ dynamic | fixed tok/s | fixed ÷ dynamic | same |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = []
        for kind in ("static", "fixed"):
            cell = r[kind]
            spread = f" ({cell['spread'][0]:.2f}–{cell['spread'][1]:.2f})" if cell["spread"] else ""
            cells += [report._f(cell["tok_s"], 1), report._f(cell["vs_dynamic"], 2, "×") + spread]
        same = " / ".join(r[kind]["same"] for kind in KINDS)
        lines.append(f"| {r['label']} | {report._f(r['dynamic']['tok_s'], 1)} | " + " | ".join(cells) + f" | {same} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_cpu_trees", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="smollm2-135m", reps=2, stem="gpu-cpu-trees")
    parser.add_argument("--note", default="", help="the machine's state, for the page (e.g. 'shared machine')")
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    models, draft_name = cli.load_pair(args.target)
    base = methods_for(grown_by_head=draft_name is None)
    methods = twins([m for m in base if m.family == "ours"])
    prompts = load_prompts(args.per_kind, cli.kinds(args))
    began = time.monotonic()
    records = run_suite(methods, models, prompts, args.reps, args.max_new_tokens)
    result = {"settings": {"target": args.target, "prompts": len(prompts), "reps": args.reps,
                           "max_new_tokens": args.max_new_tokens, "threads": threads, "note": args.note,
                           "machine": f"{platform.machine()} · torch {torch.__version__}",
                           "command": cli.command("python -m bench.gpu_cpu_trees", argv),
                           "minutes": (time.monotonic() - began) / 60},
              "rows": rows(records, [m for m in base if m.family == "ours"]), "records": records}
    cli.write(cli.out_stem(args), result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
