"""The learned self-drafters side by side on SmolLM2 (float32, CPU), with their peers in the same run.

    python -m bench.self_drafters                      # 6 prompts (chat, code writing, code editing) x 3 reps
    python -m bench.self_drafters --reps 1 --per-kind 1   # a quick look

Methods: the greedy baseline; SpecLab's EAGLE head (EAGLE-2 tree under the cost-aware controller, the Race preset);
the trained early-exit block (target layers 1..k shared + the block, AdaEDL); the trained prophet (AdaEDL);
SpecLab's untrained layer skip; transformers' generate(assistant_early_exit=k) at the same k (LayerSkip's
self-speculation, the target's own LM head after k layers). Every method runs on every prompt in every repetition,
interleaved (bench/runner.py); speed-ups are per-repetition ratios to the baseline of the same prompt and
repetition.

Per method: α by depth (greedy: P(draft d accepted | drafts 1..d-1 were, and a d-th was drafted)), τ, the draft
cost per drafted token as a fraction of a target step (draft-phase seconds / draft forwards, over the baseline's
seconds per token on the same prompt and repetition), speed-up. Plus the early-exit saving measured directly: the
verification forward over layers k..L-1 (what early exit runs) against the full forward (what it would run
without reusing layers 1..k), same tokens. Writes bench/results/self-drafters-<target>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from decoders.controller import TREE_BOUNDS

from . import cli, report
from .common import LoadMeter, load_prompts
from .runner import Method, hf, mark_identity, ours, run_suite, set_threads

DEPTHS = 6


def methods_for(k: int) -> list[Method]:
    return [ours("ours/baseline", "baseline", "baseline"),
            ours("ours/eagle-head", "EAGLE head · EAGLE-2 tree · cost-aware", "eagle2", eagle_head="auto",
                 controller="cost", **TREE_BOUNDS),
            ours("ours/early-exit", f"early exit (trained block after layer {k}) · AdaEDL", "early-exit",
                 rule="adaedl", max_draft=8),
            ours("ours/prophet", "prophet (trained) · AdaEDL", "prophet", rule="adaedl", max_draft=8),
            ours("ours/layer-skip", "layer skip (untrained) · static γ=3", "layer-skip", rule="static", gamma=3),
            hf(f"hf/early-exit-k{k}", f"transformers assistant_early_exit={k}", "early-exit", kernels="packed",
               assistant_early_exit=k)]


def candidate(spec: str) -> Method:
    """--candidate early-exit=DIR: that kind's arm again, on the weights in DIR (its shape from DIR's config)."""
    kind, _, folder = spec.partition("=")
    if kind not in ("early-exit", "prophet") or not folder:
        raise SystemExit(f"--candidate takes early-exit=FOLDER or prophet=FOLDER, got {spec!r}")
    shape = json.loads((Path(folder) / "config.json").read_text())
    what = f"after layer {shape['exit_layer']}" if kind == "early-exit" else f"{shape.get('n_layers', 1)} layer(s)"
    return ours(f"candidate/{kind}", f"{kind} candidate ({what}, {Path(folder).name}) · AdaEDL", kind,
                rule="adaedl", max_draft=8, self_weights=str(folder))


def alpha_by_depth(records: list[dict], depths: int = DEPTHS) -> list[float | None]:
    """Greedy α(d) from each round's (drafted, accepted)."""
    rounds = [r for rec in records for r in rec.get("rounds") or []]
    out = []
    for d in range(1, depths + 1):
        tried = sum(1 for drafted, accepted in rounds if drafted >= d and accepted >= d - 1)
        out.append(sum(1 for _, accepted in rounds if accepted >= d) / tried if tried else None)
    return out


def draft_cost(records: list[dict], method: str) -> float | None:
    """Median over runs of (draft seconds / draft forwards) / (the baseline's seconds per token, same prompt+rep)."""
    base = {(r["prompt"], r["rep"]): r["decode_seconds"] / max(r["decode_tokens"], 1)
            for r in records if r["method"] == "ours/baseline" and r.get("decode_tokens")}
    ratios = []
    for r in records:
        if r["method"] != method or not r.get("draft_forwards") or not r.get("phase_seconds"):
            continue
        step = base.get((r["prompt"], r["rep"]))
        if step:
            ratios.append(r["phase_seconds"]["draft"] / r["draft_forwards"] / step)
    return report.median(ratios)


def summarize(records: list[dict], methods: list[Method]) -> list[dict]:
    return [report.base_row(records, m) | {
        "alpha": alpha_by_depth([r for r in records if r["method"] == m.key])
        if m.family == "ours" and m.kind != "baseline" else None,
        "draft_cost": draft_cost(records, m.key) if m.family == "ours" else None} for m in methods]


@torch.inference_mode()
def reuse_saving(target, k: int, sizes=(1, 4, 8), past: int = 200, repeats: int = 7) -> list[dict]:
    """Best-of-repeats ms of one verification forward over n tokens: full (layers 1..L) vs early exit's (k+1..L)."""
    from decoders.drafters.early_exit import EarlyExitDrafter
    from decoders.runtime.runner import CachedModel
    from decoders.selfdraft import store
    from decoders.tree import DraftTree

    runner = CachedModel(target.model)
    runner.forward(list(range(past)), last_only=True)
    drafter = EarlyExitDrafter(runner, store.load(store.locate("early-exit", target.name), target.model))
    rows = []
    for n in sizes:
        tree = DraftTree(tokens=list(range(1, n + 1)), parents=list(range(-1, n - 1)))
        best = {"full": float("inf"), "reused": float("inf")}
        for _ in range(repeats):
            began = time.perf_counter()
            runner.forward_tree(tree)
            best["full"] = min(best["full"], time.perf_counter() - began)
            runner.drop_last(n)
            drafter.rows = list(drafter._stem(tree.tokens))  # the draft's work (not timed): layers 1..k, cached
            began = time.perf_counter()
            drafter.score(runner, tree, hidden=False)
            best["reused"] = min(best["reused"], time.perf_counter() - began)
            runner.drop_last(n)
        rows.append({"tokens": n, "full_ms": best["full"] * 1e3, "reused_ms": best["reused"] * 1e3,
                     "fraction": best["reused"] / best["full"]})
    return rows


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Learned self-drafters on {s['target']} ({s['dtype']}, {s['device']})", "",
             f"`{s['command']}` · {s['prompts']} prompts ({', '.join(s['kinds'])}) × {s['reps']} repetitions × "
             f"{s['max_new_tokens']} new tokens · greedy · {s['threads']} threads · {s['machine']} · "
             f"{(s.get('load') or {}).get('label') or 'machine load not recorded'} · {s['minutes']:.0f} min · "
             f"early exit after layer {s['exit_layer']} of {s['layers']}", "",
             "Speed-up: median over prompts of the per-repetition ratio to the baseline (range of all ratios). τ = new "
             "tokens ÷ target forwards (prefill included). α(d): P(draft d accepted | drafts 1..d-1 were). Draft cost: "
             "seconds per draft forward ÷ the baseline's seconds per token (same prompt and repetition). transformers' "
             "early exit runs draft and verification on one model object, so its τ and α are not separable from its "
             "call counts (–).", "",
             "| method | tokens/s | speed-up | τ | α by depth 1..6 | draft cost | same as baseline |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        spread = f" ({r['spread'][0]:.2f}–{r['spread'][1]:.2f})" if r["spread"] else ""
        alpha = " ".join("–" if a is None else f"{a:.2f}" for a in r["alpha"]) if r["alpha"] else "–"
        lines.append(f"| {r['label']} | {report._f(r['tok_s'], 1)} | "
                     f"{report._f(r['speedup'], 2, '×') if r['speedup'] else '1 (yardstick)'}{spread} | "
                     f"{report._f(r['tau'])} | {alpha} | {report._f(r['draft_cost'])} | {r['identical']} |")
    lines += ["", "Early exit's reuse of layers 1..k, measured: one verification forward after a 200-token context.",
              "", "| tokens verified | full forward (ms) | layers k+1..L only (ms) | fraction |", "|---|---|---|---|"]
    for r in result.get("reuse", []):
        lines.append(f"| {r['tokens']} | {r['full_ms']:.1f} | {r['reused_ms']:.1f} | {r['fraction']:.2f} |")
    return "\n".join(lines + ["", result.get("note", "")]) + "\n"


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["method"] != "ours/baseline"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = [r["label"].split(" · ")[0] for r in rows]
    speed = [r["speedup"] or 0 for r in rows]
    left.barh(names, speed, color=["#E69F00" if "ours" in r["method"] else "#999999" for r in rows])
    left.axvline(1.0, color="black", linewidth=1)
    left.set_xlabel("speed-up over the greedy baseline (median)")
    for r in rows:
        if r["alpha"]:
            right.plot(range(1, len(r["alpha"]) + 1), [a if a is not None else float("nan") for a in r["alpha"]],
                       marker="o", label=r["label"].split(" · ")[0])
    right.set_xlabel("draft depth")
    right.set_ylabel("α (greedy acceptance)")
    right.set_ylim(0, 1)
    right.legend(fontsize=8)
    fig.suptitle(f"Self-drafters on {result['settings']['target']}, {result['settings']['dtype']} CPU", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.self_drafters", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="smollm2-135m", reps=3, stem="self-drafters")
    parser.add_argument("--candidate", action="append", default=[], metavar="KIND=FOLDER",
                        help="also race newly trained weights (early-exit=DIR or prophet=DIR) against the shipped "
                             "ones in the same run, before shipping them")
    args = parser.parse_args(argv)
    from decoders.runtime.models import load_model
    from decoders.runtime.runner import decoder_layers
    from decoders.selfdraft import store

    threads = set_threads(args.threads)
    target = load_model(args.target, dtype="float32")
    k = json.loads((store.locate("early-exit", target.name) / "config.json").read_text())["exit_layer"]
    methods = methods_for(k) + [candidate(spec) for spec in args.candidate]
    kinds = cli.kinds(args)
    prompts = load_prompts(args.per_kind, kinds)
    began, load = time.monotonic(), LoadMeter().start()
    records = run_suite(methods, {"target": target}, prompts, args.reps, args.max_new_tokens)
    mark_identity(records)
    reuse = reuse_saving(target, k)
    load = load.stop()
    result = {"settings": {"target": args.target, "dtype": "float32", "device": str(target.device),
                           "prompts": len(prompts), "kinds": kinds, "reps": args.reps,
                           "max_new_tokens": args.max_new_tokens, "threads": threads, "exit_layer": k,
                           "layers": len(decoder_layers(target.model)),
                           "machine": f"{platform.machine()} · torch {torch.__version__}", "load": load,
                           "command": cli.command("python -m bench.self_drafters", argv),
                           "minutes": (time.monotonic() - began) / 60},
              "rows": summarize(records, methods), "reuse": reuse, "records": records}
    stem = cli.out_stem(args)
    cli.write(stem, result, markdown(result))
    chart(result, Path(f"{stem}.png"))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
