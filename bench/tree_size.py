"""Pick EAGLE-2's tree size M for this machine from the t(n) curve: `python -m bench.tree_size`.

The papers send M = 59 drafts per round because on a GPU verifying 60 tokens costs about one token's forward. Here
t(n) grows with n, so every extra node buys acceptance at a rising price. The pick, made on the prompts' tuning
split (never on the scored prompts):

1. t(n): the target's forward over n tokens against one token, after a fixed context (bench/costs.py).
2. One EAGLE-2 run at the largest candidate M on each tuning prompt. EAGLE-2 sends the M most valuable candidates,
   and a candidate's value never grows along its path, so the sent set is ancestor-closed: under greedy decoding a
   smaller tree would have accepted exactly the accepted-path nodes whose value rank is ≤ M. So one run gives
   every smaller M's accepted length, round by round (the rounds themselves would fall differently; their mean is
   the estimate).
3. Per M: predicted tokens/s = (1 + mean accepted(M)) / (draft s + bookkeeping s + t(1) s · t(M + 1)), with the
   draft and bookkeeping seconds per round measured in the same run (growing the tree does not depend on M).

Then EAGLE-2 at every candidate M and the baseline run interleaved on the scored prompts, so the table sets the
prediction next to the measurement. Writes bench/results/tree-size-<target>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from . import report
from .__main__ import load_prompts
from .costs import forward_cost_curve, t_of
from .runner import Prompt, mark_identity, ours, run_suite, set_threads

RESULTS = Path(__file__).resolve().parent / "results"
CANDIDATES = (4, 8, 12, 16, 24, 32, 48, 59)


def accepted_ranks(trace) -> list[list[int]]:
    """Per round that grew a tree: the value ranks (1 = most valuable in the pool) of the nodes the target accepted."""
    out = []
    for rnd in trace.rounds:
        search = rnd.search or {}
        pool, chosen = search.get("pool") or [], search.get("chosen") or []
        if not pool:
            continue
        ranked = sorted(pool, key=lambda e: -float(e["value"]))  # stable: EAGLE-2's rerank order on ties
        rank = {int(e["id"]): i + 1 for i, e in enumerate(ranked)}
        accepted = [n.id for n in rnd.nodes[1:] if n.status == "accepted"]  # tree node i is chosen[i - 1]
        out.append(sorted(rank[int(chosen[node - 1])] for node in accepted))
    return out


def predict(ranks: list[list[int]], fixed_seconds: float, t1_seconds: float, curve: dict,
            candidates=CANDIDATES) -> list[dict]:
    """Per M: tokens per round (accepted + the target's own token), seconds per round, tokens/s, and the ratio to
    the baseline's 1 / t(1). `fixed_seconds`: draft + bookkeeping per round, which do not depend on M."""
    rows = []
    for m in candidates:
        t_verify = t_of(curve, m + 1)
        if t_verify is None or not ranks:
            continue
        tokens = 1 + statistics.mean(sum(r <= m for r in round_ranks) for round_ranks in ranks)
        seconds = fixed_seconds + t1_seconds * t_verify
        rows.append({"m": m, "tokens_per_round": tokens, "t_verify": t_verify, "seconds_per_round": seconds,
                     "tok_s": tokens / seconds, "speedup": tokens / seconds * t1_seconds})
    return rows


def pick(predicted: list[dict]) -> int:
    return max(predicted, key=lambda row: row["tok_s"])["m"]


def probe(models: dict, prompts: list[Prompt], max_m: int, head: dict, max_new_tokens: int, k: int, depth: int):
    """EAGLE-2 at size max_m on each prompt: (accepted ranks per round, draft + bookkeeping seconds per round)."""
    from decoders import DecodeOptions, stream

    target, ranks, fixed = models["target"], [], []
    for prompt in prompts:
        options = DecodeOptions(model=target.name, method="speculative", drafter="eagle2", tree_k=k,
                                tree_depth=depth, tree_m=max_m, max_new_tokens=max_new_tokens, **head)
        trace = None
        for trace in stream(options, prompt.ids, target=target, draft=models.get("draft")):
            pass
        ranks += accepted_ranks(trace)
        fixed += [r.seconds.get("draft", 0.0) + r.seconds.get("bookkeeping", 0.0) for r in trace.rounds if r.search]
    return ranks, statistics.median(fixed) if fixed else 0.0


def markdown(result: dict) -> str:
    s = result["settings"]
    measured = {r["m"]: r for r in result["measured"]}
    lines = [f"# EAGLE-2's tree size M on {s['target']} ({s['dtype']}, {s['grower']})", "",
             f"`{s['command']}` · picked on {s['tuning_prompts']} tuning prompts, checked on {s['prompts']} scored "
             f"prompts × {s['reps']} repetitions × {s['max_new_tokens']} new tokens · greedy · K {s['k']}, D "
             f"{s['depth']} · {s['threads']} threads · {s['machine']} · {s['minutes']:.0f} min", "",
             f"t(1) = {s['t1_ms']:.1f} ms; draft + bookkeeping per round {s['fixed_ms']:.1f} ms (median of the probe "
             "run). Predicted from the probe run's accepted-path value ranks and the measured t(n) (see the "
             "module's docstring); measured = EAGLE-2 run at that M, speed-up = median per-repetition ratio to the "
             "baseline of the same prompt.", "",
             "| M | t(M+1) | predicted tokens / round | predicted speed-up | measured speed-up | measured τ | "
             "same as baseline |", "|---|---|---|---|---|---|---|"]
    for row in result["predicted"]:
        m = measured.get(row["m"], {})
        mark = " **(picked)**" if row["m"] == result["picked"] else ""
        lines.append(f"| {row['m']}{mark} | {row['t_verify']:.2f} | {row['tokens_per_round']:.2f} | "
                     f"{row['speedup']:.2f}× | {report._f(m.get('speedup'), 2, '×')} | {report._f(m.get('tau'))} | "
                     f"{m.get('identical', '—')} |")
    best = max(result["measured"], key=lambda r: r["speedup"] or 0, default=None)
    if best:
        lines += ["", f"Picked M = {result['picked']} (predicted); the measured best was M = {best['m']} "
                      f"({best['speedup']:.2f}×)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tree_size", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--candidates", default=",".join(map(str, CANDIDATES)))
    parser.add_argument("--k", type=int, default=10, help="EAGLE-2's K (the paper's 10)")
    parser.add_argument("--depth", type=int, default=6, help="EAGLE-2's D (the paper's 6)")
    parser.add_argument("--per-kind", type=int, default=2)
    parser.add_argument("--kinds", default="chat,code-writing,code-editing")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="output stem (default bench/results/tree-size-<target>)")
    args = parser.parse_args(argv)
    from decoders.models import REGISTRY, ModelError, load_model

    candidates = sorted({int(m) for m in args.candidates.split(",")})
    threads = set_threads(args.threads)
    entry = REGISTRY.get(args.target)
    draft_name = entry.default_draft if entry is not None else None
    try:
        models = {"target": load_model(args.target, dtype="float32")}
        if draft_name:
            models["draft"] = load_model(draft_name, dtype="float32")
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    head = {} if draft_name else {"eagle_head": "auto"}
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    tuning, scored = load_prompts(args.per_kind, kinds, split="tuning"), load_prompts(args.per_kind, kinds)
    for prompt in tuning + scored:
        prompt.ids = models["target"].encode_prompt(prompt.text, chat=True)
    began = time.monotonic()
    curve = forward_cost_curve(models["target"].model, tuning[0].ids, ns=sorted({1, *(m + 1 for m in candidates)}))
    t1 = curve["seconds"]["1"]
    ranks, fixed = probe(models, tuning, max(candidates), head, args.max_new_tokens, args.k, args.depth)
    predicted = predict(ranks, fixed, t1, curve, candidates)
    methods = [ours("ours/baseline", "baseline", "baseline")] + [
        ours(f"ours/eagle2-m{m}", f"EAGLE-2 M {m}", "eagle2", tree_k=args.k, tree_depth=args.depth, tree_m=m, **head)
        for m in candidates]
    records = run_suite(methods, models, scored, args.reps, args.max_new_tokens)
    mark_identity(records)
    measured = []
    for m in candidates:
        key = f"ours/eagle2-m{m}"
        mine = [r for r in records if r["method"] == key]
        same = [r["identical_to_baseline"] for r in mine if r.get("identical_to_baseline") is not None]
        measured.append({"m": m, "speedup": report.ratio_over(records, key, "ours/baseline")["median"],
                         "tau": report.median([r["tau"] for r in mine]), "identical": f"{sum(same)}/{len(same)}"})
    result = {"settings": {"target": args.target, "grower": "draft model" if draft_name else "EAGLE head",
                           "dtype": "float32", "k": args.k, "depth": args.depth, "candidates": candidates,
                           "tuning_prompts": len(tuning), "prompts": len(scored), "reps": args.reps,
                           "max_new_tokens": args.max_new_tokens, "threads": threads,
                           "machine": f"{platform.machine()} · torch {torch.__version__}",
                           "t1_ms": 1000 * t1, "fixed_ms": 1000 * fixed,
                           "command": " ".join(["python -m bench.tree_size", *(argv if argv is not None else sys.argv[1:])]),
                           "minutes": (time.monotonic() - began) / 60},
              "curve": curve, "predicted": predicted, "picked": pick(predicted), "measured": measured,
              "records": records}
    stem = Path(args.out) if args.out else RESULTS / f"tree-size-{args.target}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    Path(f"{stem}.md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
