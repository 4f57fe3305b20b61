"""Draft trees on real weights: EAGLE-2 and DDD next to a chain drafter and the baseline, same prompts, same run.

    python -m bench.trees                              # SmolLM2-135M, trees grown by its EAGLE head
    python -m bench.trees --target qwen2.5-coder-1.5b  # the Qwen pair, trees grown by the 0.5B draft model

Every method runs on every prompt in every repetition, interleaved (bench/runner.py); speed-ups are per-repetition
ratios against the baseline of the same prompt and repetition. EAGLE's static tree runs with SpecLab's 24-node
shape; EAGLE-2 and DDD run with the papers' shapes (EAGLE-2: K 10, D 6, M 59; DDD: S 5,7,9, x −0.3, n 11, w 10,
M 59), and EAGLE-2 also under the cost-aware draft controller (decoders/controller.py: it grows up to K 4, D 16 and
sends up to M 32, as far as this machine's measured t(n) and the frontier's values say it pays), because on a CPU
verifying n tokens costs more than one (t(n) grows) while the papers measured on GPUs where t(60) ≈ t(1).
Writes bench/results/trees-<target>.{json,md}.
"""
from __future__ import annotations

import argparse
import platform
import time

import torch

from decoders.controller import TREE_BOUNDS

from . import cli, report
from .common import LoadMeter, load_prompts
from .runner import Method, hf, mark_identity, ours, run_suite, set_threads
from .tuning import hf_assisted, hf_prompt_lookup

PAPER_EAGLE2 = dict(tree_k=10, tree_depth=6, tree_m=59)
PAPER_DDD = dict(tree_k=10, tree_m=59)  # S, x, n, w: DecodeOptions' defaults are the DDD paper's
CONTROLLED_TREE = dict(**TREE_BOUNDS, controller="cost")  # the Race's cost-aware tree preset
# HF assisted generation as the full pair run tuned it (bench/results/pair.md, on prompts it did not score).
HF_ASSISTED = dict(num_assistant_tokens=10, assistant_confidence_threshold=0.6,
                   num_assistant_tokens_schedule="heuristic")
# transformers has no EAGLE head; where SpecLab grows trees with one, transformers' own methods for a target without a
# draft model race on the same prompts: prompt lookup on the chain arm's settings (γ 10, n-grams 3..1) and
# LayerSkip's assistant_early_exit with transformers' documented exit layer (untrained for early exit here).
HF_PROMPT_LOOKUP = dict(prompt_lookup_num_tokens=10, max_matching_ngram_size=3)
HF_EARLY_EXIT = 4


def methods_for(grown_by_head: bool) -> list[Method]:
    """Baseline, a chain drafter (and HF assisted generation where there is a draft model) and the trees, on the
    grower the target has."""
    head = {"eagle_head": "auto"} if grown_by_head else {}
    grower = "EAGLE head" if grown_by_head else "draft model"
    chain = ours("ours/prompt-lookup", "prompt lookup γ=10 (chain)", "prompt-lookup", gamma=10) if grown_by_head \
        else ours("ours/draft-model", "draft model · AdaEDL (chain)", "draft-model", rule="adaedl", max_draft=8)
    # transformers gets the very draft object SpecLab's draft-model arms use (the same draft_quant, "auto")
    peers = [hf_prompt_lookup("hf/prompt-lookup", HF_PROMPT_LOOKUP, "packed"),
             hf("hf/early-exit", f"HF assistant_early_exit={HF_EARLY_EXIT} (LayerSkip, untrained exit; packed kernels)",
                "early-exit", kernels="packed", assistant_early_exit=HF_EARLY_EXIT)] if grown_by_head \
        else [hf_assisted("hf/assisted@packed", HF_ASSISTED, "packed", "auto")]
    return [ours("ours/baseline", "baseline", "baseline"), chain, *peers,
            ours("ours/eagle1-static", f"EAGLE static tree · {grower} · 24 nodes", "eagle1", **head),
            ours("ours/eagle2-paper", f"EAGLE-2 · {grower} · K10 D6 M59 (paper)", "eagle2", **head, **PAPER_EAGLE2),
            ours("ours/eagle2-cost", f"EAGLE-2 · {grower} · cost-aware (K4, up to D16 M32)", "eagle2", **head,
                 **CONTROLLED_TREE),
            ours("ours/ddd-paper", f"DDD · {grower} · M59, S 5,7,9, x −0.3 (paper)", "ddd", **head, **PAPER_DDD)]


def summarize(records: list[dict], methods: list[Method]) -> list[dict]:
    rows = []
    for m in methods:
        mine = [r for r in records if r["method"] == m.key]
        rows.append(report.base_row(records, m) | {
            "draft": report.draft_of(mine),
            # transformers' early exit drafts and verifies on one model object: its counts are not separable (None)
            "accepted_per_round": report.median([r["accepted"] / max(1, r["target_forwards"] - 1) for r in mine
                                                 if r["accepted"] is not None]),
            "drafted_per_round": report.median([r["drafted"] / max(1, r["target_forwards"] - 1) for r in mine
                                                if r["drafted"] is not None]),
            "peak_kv_mib": report.median([r["peak_kv_bytes"] / 2 ** 20 for r in mine
                                          if r.get("peak_kv_bytes")])})  # HF's runs do not report it
    return rows


def versus_best_peer(records: list[dict], rows: list[dict], method: str = "ours/eagle2-cost") -> dict | None:
    """`method` against transformers' fastest method in this run (by its speed-up over the baseline): the median
    over prompts of per-repetition ratios, as every speed-up here. None when no transformers method ran."""
    peers = [r for r in rows if r["method"].startswith("hf/") and r["speedup"]]
    if not peers or not any(r["method"] == method for r in rows):
        return None
    best = max(peers, key=lambda r: r["speedup"])
    ratio = report.ratio_over(records, method, best["method"])
    return {"method": method, "peer": best["method"], "peer_label": best["label"], "ratio": ratio["median"],
            "spread": ratio["spread"]}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Draft trees on {s['target']} ({s['dtype']}, {s['device']})", "",
             f"`{s['command']}` · {s['prompts']} prompts ({', '.join(s['kinds'])}) × {s['reps']} repetitions × "
             f"{s['max_new_tokens']} new tokens · greedy · {s['threads']} threads · {s['machine']} · "
             f"{(s.get('load') or {}).get('label') or 'machine load not recorded'} · {s['minutes']:.0f} min", "",
             "Speed-up = median over prompts of the per-repetition ratio to the baseline of the same prompt and "
             "repetition (range of all ratios in brackets). τ = new tokens ÷ target forwards (prefill included). "
             "Accepted/drafted per round: drafts accepted and drafts sent to the target per verification. Peak KV: "
             "the target's cache peak plus the drafter's. Same as baseline: runs whose tokens equal the greedy "
             "baseline's. Draft: the draft model's precision, read from the draft object each run decoded with "
             "(transformers' assisted generation is handed the same object as SpecLab's draft-model arms).", "",
             "| method | draft | tokens/s | speed-up | τ | accepted / round | sent / round | peak KV | same as "
             "baseline |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        spread = f" ({r['spread'][0]:.2f}–{r['spread'][1]:.2f})" if r["spread"] else ""
        lines.append(f"| {r['label']} | {r.get('draft') or '–'} | {report._f(r['tok_s'], 1)} | "
                     f"{report._f(r['speedup'], 2, '×') if r['speedup'] else '1 (yardstick)'}{spread} | "
                     f"{report._f(r['tau'])} | {report._f(r['accepted_per_round'])} | "
                     f"{report._f(r['drafted_per_round'], 1)} | "
                     f"{report._f(r['peak_kv_mib'], 1) + ' MiB' if r['peak_kv_mib'] else 'not reported'} | "
                     f"{r['identical']} |")
    versus = result.get("versus_best_peer")
    if versus:
        label = next(r["label"] for r in result["rows"] if r["method"] == versus["method"])
        lines += ["", f"**{label}** against transformers' fastest method here ({versus['peer_label']}; transformers has "
                      f"no EAGLE head): {versus['ratio']:.2f}× ({versus['spread'][0]:.2f}–{versus['spread'][1]:.2f}), "
                      "the median over prompts of per-repetition ratios."]
    lines += ["", result.get("note", "")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trees", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="smollm2-135m", reps=2, stem="trees")
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    models, draft_name = cli.load_pair(args.target)
    methods = methods_for(grown_by_head=draft_name is None)
    kinds = cli.kinds(args)
    prompts = load_prompts(args.per_kind, kinds)
    began, load = time.monotonic(), LoadMeter().start()
    records = run_suite(methods, models, prompts, args.reps, args.max_new_tokens)
    mark_identity(records)
    result = {"settings": {"target": args.target, "draft": draft_name, "dtype": "float32", "load": load.stop(),
                           "device": str(models["target"].device), "prompts": len(prompts), "kinds": kinds,
                           "reps": args.reps, "max_new_tokens": args.max_new_tokens, "threads": threads,
                           "machine": f"{platform.machine()} · torch {torch.__version__}",
                           "command": cli.command("python -m bench.trees", argv),
                           "minutes": (time.monotonic() - began) / 60},
              "rows": summarize(records, methods), "records": records}
    result["versus_best_peer"] = versus_best_peer(records, result["rows"])
    cli.write(cli.out_stem(args), result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
