"""Which fixed EAGLE-2 tree shape (K, D, M) this machine would pick from its t(n): `python -m bench.tree_size`.

The app and the Race no longer use a fixed CPU shape: the draft controller (decoders/controller.py) chooses how far
to grow and how much to send every round. This sweep is the check on it: the best fixed shape for this machine, the
papers' shape, and what each predicts and measures. A pick may be degenerate, and the table says so: K 1 is a chain
(one candidate per step), M 1 a single draft token.

The papers send M = 59 drafts per round, grown K = 10 wide and D = 6 deep, because on a GPU verifying 60 tokens
costs about one token's forward. Here t(n) grows with n and every draft forward has its price, so each extra node
and each extra step buys acceptance at a rising cost. The pick, made on the prompts' tuning split (never on the
scored prompts):

1. t(n): the target's forward over n tokens against one token, after a fixed context (decoders/costs.py: 5
   interleaved repetitions, median, made non-decreasing); the chain curve for K 1, the tree-mask curve (a branching
   tree takes another code path) for K > 1.
2. Per K: one EAGLE-2 run at the deepest D and the largest M on each tuning prompt. EAGLE-2 sends the M most
   valuable candidates, and a candidate's value never grows along its path, so the sent set is ancestor-closed;
   a shallower tree's pool is the deeper one's first D steps. So in a round with the same context, a tree of depth
   D and size M would accept the accepted-path nodes from steps <= D whose value rank among those steps' nodes is
   <= M. Over a run this is an estimate, not an exact prediction: a smaller tree accepts less per round, so its
   rounds start from other contexts. K changes which nodes exist at all, so each K gets its own run.
3. Per (K, D, M): predicted tokens/s = (1 + mean accepted) / (growth s + t(1) s * t(M + 1)), where growth = the
   draft and bookkeeping seconds per round measured in K's run, scaled by D / the run's steps (an approximation:
   every expansion step is one draft forward over a K-wide frontier; checked by the measurement).

Then the best predicted shapes, the papers' shape and a chain drafter run interleaved with the baseline on the
scored prompts, so the table sets each prediction next to its measurement. Writes
bench/results/tree-size-<target>.{json,md}.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from . import cli, report
from .common import LoadMeter, Prompt, load_prompts
from decoders import costs

from .runner import mark_identity, ours, run_suite, set_threads
from .trees import PAPER_EAGLE2, methods_for

CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 59)
KS = (2, 4, 10)
DEPTHS = (1, 2, 3, 4, 6, 8)
PAPER = tuple(PAPER_EAGLE2[key] for key in ("tree_k", "tree_depth", "tree_m"))  # always measured, for reference


def accepted_ranks(trace, depth: int | None = None) -> list[list[int]]:
    """Per round that grew a tree: the value ranks (1 = most valuable) of the nodes the target accepted, among the
    pool nodes of expansion steps <= depth (all steps if None); accepted nodes from deeper steps are left out."""
    out = []
    for rnd in trace.rounds:
        search = rnd.search or {}
        pool, chosen = search.get("pool") or [], search.get("chosen") or []
        if not pool:
            continue
        kept = [e for e in pool if depth is None or int(e["step"]) <= depth]
        ranked = sorted(kept, key=lambda e: -float(e["value"]))  # stable: EAGLE-2's rerank order on ties
        rank = {int(e["id"]): i + 1 for i, e in enumerate(ranked)}
        accepted = [int(chosen[n.id - 1]) for n in rnd.nodes[1:] if n.status == "accepted"]  # node i = chosen[i-1]
        out.append(sorted(rank[pool_id] for pool_id in accepted if pool_id in rank))
    return out


def pool_size(k: int, depth: int) -> int:
    """EAGLE-2's candidate pool: K at step 1, then K frontier nodes times K children per step."""
    return k + (depth - 1) * k * k


def verify_cost(curve, m: int, k: int | None) -> float | None:
    """t(M + 1) from a decoders.costs.CostCurve (the tree-mask curve when the tree branches), or a plain
    {"t": {n: t}} dict (tests); None beyond what was measured."""
    if isinstance(curve, dict):
        table = {int(n): t for n, t in curve["t"].items()}
        return costs.interpolate(table, m + 1) if m + 1 <= max(table) else None
    return curve.t(m + 1, tree=bool(k and k > 1)) if m + 1 <= max(curve.ns) else None


def predict(ranks: list[list[int]], fixed_seconds: float, t1_seconds: float, curve,
            candidates=CANDIDATES, k: int | None = None, depth: int | None = None) -> list[dict]:
    """Per M: tokens per round (accepted + the target's own token), seconds per round, tokens/s, and the ratio to
    the baseline's 1 / t(1). `fixed_seconds`: growth (draft + bookkeeping) per round, which does not depend on M.
    With k and depth given, sizes beyond the pool are left out (the tree they send is the whole pool)."""
    rows = []
    for m in candidates:
        t_verify = verify_cost(curve, m, k)
        if t_verify is None or not ranks or (k and depth and m > pool_size(k, depth)):
            continue
        tokens = 1 + statistics.mean(sum(r <= m for r in round_ranks) for round_ranks in ranks)
        seconds = fixed_seconds + t1_seconds * t_verify
        rows.append({"k": k, "depth": depth, "m": m, "tokens_per_round": tokens, "t_verify": t_verify,
                     "growth_s": fixed_seconds, "seconds_per_round": seconds, "tok_s": tokens / seconds,
                     "speedup": tokens / seconds * t1_seconds})
    return rows


def pick(predicted: list[dict]) -> dict:
    """The predicted row with the most tokens/s."""
    return max(predicted, key=lambda row: row["tok_s"])


def shape_of(row: dict) -> tuple[int, int, int]:
    return row["k"], row["depth"], row["m"]


def to_measure(predicted: list[dict], best: int) -> list[tuple[int, int, int]]:
    """The `best` predicted shapes, then the papers' shape (once)."""
    ranked = [shape_of(r) for r in sorted(predicted, key=lambda r: -r["tok_s"])]
    return list(dict.fromkeys(ranked[:best] + [PAPER]))


def probe(models: dict, prompts: list[Prompt], k: int, depth: int, max_m: int, head: dict, max_new_tokens: int):
    """EAGLE-2 at (k, depth, max_m) on each prompt: the traces, and growth seconds per expansion step (median)."""
    from decoders import DecodeOptions, stream

    traces, per_step = [], []
    for prompt in prompts:
        options = DecodeOptions(model=models["target"].name, method="speculative", drafter="eagle2", tree_k=k,
                                tree_depth=depth, tree_m=max_m, max_new_tokens=max_new_tokens, **head)
        trace = None
        for trace in stream(options, prompt.ids, target=models["target"], draft=models.get("draft")):
            pass
        traces.append(trace)
        per_step += [(r.seconds.get("draft", 0.0) + r.seconds.get("bookkeeping", 0.0)) / r.search["steps"]
                     for r in trace.rounds if r.search and r.search.get("steps")]
    return traces, statistics.median(per_step) if per_step else 0.0


def predict_grid(traces_by_k: dict, per_step_by_k: dict, depths, t1: float, curve, candidates) -> list[dict]:
    rows = []
    for k, traces in traces_by_k.items():
        for depth in depths:
            ranks = [r for trace in traces for r in accepted_ranks(trace, depth)]
            rows += predict(ranks, per_step_by_k[k] * depth, t1, curve, candidates, k=k, depth=depth)
    return rows


def table_rows(result: dict) -> list[dict]:
    """Per (K, D) its best predicted M, plus every measured shape; best predicted first."""
    predicted = result["predicted"]
    measured = {tuple(m["shape"]) for m in result["measured"]}
    best = {}
    for row in predicted:
        key = (row["k"], row["depth"])
        if key not in best or row["tok_s"] > best[key]["tok_s"]:
            best[key] = row
    keep = {shape_of(r) for r in best.values()} | measured
    return sorted((r for r in predicted if shape_of(r) in keep), key=lambda r: -r["speedup"])


def markdown(result: dict) -> str:
    s = result["settings"]
    measured = {tuple(m["shape"]): m for m in result["measured"]}
    picked = tuple(result["picked"])
    lines = [f"# EAGLE-2's tree shape on {s['target']} ({s['dtype']}, {s['grower']})", "",
             f"`{s['command']}` · picked on {s['tuning_prompts']} tuning prompts, checked on {s['prompts']} scored "
             f"prompts × {s['reps']} repetitions × {s['max_new_tokens']} new tokens · greedy · K in "
             f"{', '.join(map(str, s['ks']))}, D in {', '.join(map(str, s['depths']))} · {s['threads']} threads · "
             f"{s['machine']} · {(s.get('load') or {}).get('label') or 'machine load not recorded'} · "
             f"{s['minutes']:.0f} min", "",
             f"t(1) = {s['t1_ms']:.1f} ms; t(n) from {s.get('cost_repeats', 3)} interleaved repetitions, made "
             "non-decreasing (decoders/costs.py; the tree-mask curve for K > 1). Growth = draft + bookkeeping seconds "
             "per round (per-step median of K's probe run × D). Predicted from the probe runs' accepted-path value "
             "ranks and t(n): an estimate (see the module's docstring); each (K, D) is shown at its best predicted M, "
             "plus every measured shape. K 1 is a chain, not a tree; M 1 sends a single draft token. Measured "
             "speed-up = median per-repetition ratio to the baseline of the same prompt.", "",
             "| K | D | M | growth / round | t(M+1) | predicted tokens / round | predicted speed-up | "
             "measured speed-up | measured τ | same as baseline |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in table_rows(result):
        m = measured.get(shape_of(row), {})
        mark = " **(picked)**" if shape_of(row) == picked else " (paper)" if shape_of(row) == PAPER else ""
        mark += degenerate(shape_of(row))
        lines.append(f"| {row['k']} | {row['depth']} | {row['m']}{mark} | {1000 * row['growth_s']:.0f} ms | "
                     f"{row['t_verify']:.2f} | {row['tokens_per_round']:.2f} | {row['speedup']:.2f}× | "
                     f"{report._f(m.get('speedup'), 2, '×')} | {report._f(m.get('tau'))} | "
                     f"{m.get('identical', '—')} |")
    best = max(result["measured"], key=lambda r: r["speedup"] or 0, default=None)
    if best:
        lines += ["", f"Picked K {picked[0]}, D {picked[1]}, M {picked[2]}{degenerate(picked)} (predicted); the "
                      f"measured best was K {best['shape'][0]}, D {best['shape'][1]}, M {best['shape'][2]}"
                      f"{degenerate(tuple(best['shape']))} ({best['speedup']:.2f}×)."]
    chain = result.get("chain")
    if best and chain and chain.get("speedup"):
        lines.append(f"The chain drafter in the same run, {chain['label']}: {chain['speedup']:.2f}×; the best "
                     f"measured tree ÷ the chain = {best['speedup'] / chain['speedup']:.2f}×.")
    return "\n".join(lines) + "\n"


def degenerate(shape: tuple[int, int, int]) -> str:
    """What a shape really is when it is not a tree."""
    k, depth, m = shape
    if m == 1:
        return " (a single draft token)"
    if k == 1:
        return f" (a chain of {min(depth, m)}, not a tree)"
    return ""


def _ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tree_size", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="smollm2-135m", reps=1, stem="tree-size")
    parser.add_argument("--candidates", default=",".join(map(str, CANDIDATES)), help="tree sizes M")
    parser.add_argument("--ks", default=",".join(map(str, KS)), help="EAGLE-2's K (the paper's 10)")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="EAGLE-2's D (the paper's 6)")
    parser.add_argument("--measure", type=int, default=3, help="how many of the best predicted shapes to run")
    parser.add_argument("--cost-repeats", type=int, default=5, help="repetitions of each t(n) timing (median)")
    args = parser.parse_args(argv)
    from decoders.runtime.models import ModelError

    candidates, ks, depths = _ints(args.candidates), _ints(args.ks), _ints(args.depths)
    threads = set_threads(args.threads)
    try:
        models, draft_name = cli.load_pair(args.target)
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    head = {} if draft_name else {"eagle_head": "auto"}
    kinds = cli.kinds(args)
    tuning, scored = load_prompts(args.per_kind, kinds, split="tuning"), load_prompts(args.per_kind, kinds)
    for prompt in tuning + scored:
        prompt.ids = models["target"].encode_prompt(prompt.text, chat=True)
    began, load = time.monotonic(), LoadMeter().start()
    curve = costs.measure(models["target"], refresh=True, ns=tuple(sorted({1, *(m + 1 for m in candidates)})),
                          repeats=args.cost_repeats)
    t1 = curve.step_seconds
    traces, per_step = {}, {}
    for k in ks:
        traces[k], per_step[k] = probe(models, tuning, k, max(depths), max(candidates), head, args.max_new_tokens)
        print(f"probe K {k}: growth {1000 * per_step[k]:.1f} ms per step", flush=True)
    predicted = predict_grid(traces, per_step, depths, t1, curve, candidates)
    shapes = to_measure(predicted, args.measure)
    chain = methods_for(grown_by_head=not draft_name)[1]
    methods = [ours("ours/baseline", "baseline", "baseline"), chain] + [
        ours(f"ours/eagle2-k{k}-d{d}-m{m}", f"EAGLE-2 K {k} D {d} M {m}", "eagle2", tree_k=k, tree_depth=d, tree_m=m,
             **head) for k, d, m in shapes]
    records = run_suite(methods, models, scored, args.reps, args.max_new_tokens)
    mark_identity(records)
    measured = []
    for k, d, m in shapes:
        key = f"ours/eagle2-k{k}-d{d}-m{m}"
        mine = [r for r in records if r["method"] == key]
        same = [r["identical_to_baseline"] for r in mine if r.get("identical_to_baseline") is not None]
        measured.append({"shape": [k, d, m], "speedup": report.ratio_over(records, key, "ours/baseline")["median"],
                         "tau": report.median([r["tau"] for r in mine]), "identical": f"{sum(same)}/{len(same)}"})
    result = {"settings": {"target": args.target, "grower": "draft model" if draft_name else "EAGLE head",
                           "dtype": "float32", "ks": ks, "depths": depths, "candidates": candidates,
                           "tuning_prompts": len(tuning), "prompts": len(scored), "reps": args.reps,
                           "cost_repeats": args.cost_repeats,
                           "max_new_tokens": args.max_new_tokens, "threads": threads,
                           "machine": f"{platform.machine()} · torch {torch.__version__}", "t1_ms": 1000 * t1,
                           "load": load.stop(),
                           "growth_ms_per_step": {str(k): 1000 * v for k, v in per_step.items()},
                           "command": cli.command("python -m bench.tree_size", argv),
                           "minutes": (time.monotonic() - began) / 60},
              "curve": curve.to_dict(), "predicted": predicted, "picked": list(shape_of(pick(predicted))),
              "measured": measured, "records": records,
              "chain": {"label": chain.label, "speedup": report.ratio_over(records, chain.key, "ours/baseline")["median"]}}
    cli.write(cli.out_stem(args), result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
