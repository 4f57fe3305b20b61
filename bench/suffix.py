"""Suffix decoding against prompt lookup and a vLLM-style n-gram proposer, same prompts, same run.

    flock /tmp/speclab-heavy.lock .venv/bin/python -m bench.suffix                 # SmolLM2-135M
    flock /tmp/speclab-heavy.lock .venv/bin/python -m bench.suffix --target qwen2.5-coder-1.5b
    flock /tmp/speclab-heavy.lock .venv/bin/python -m bench.suffix --tune    # choose the factor (tuning prompts)

The three prompt kinds (assets/bench: chat, code writing, code editing) plus a multi-turn set built here from
HumanEval: chains of requests about one function, where each later turn asks for the function again with a change
(type hints, then comments) and sees the earlier turns' answers only through the suffix store (a visitor's
earlier outputs, decoders/drafters/suffix.py), as an agent re-asking a model sees its earlier replies. The store of
turn t holds the greedy answers of turns 1..t-1 of its chain, made once before the timed runs (every method is
lossless, so they are every method's answers too; the run checks that each output equals the baseline's).

Methods, all model-free chains or trees verified by the same core: the baseline; SpecLab's prompt lookup (static
γ 4, and the Race's cost-aware length); vLLM's n-gram proposer (the longest tail of 3 to 5 tokens that occurred,
its first occurrence, k = 5 tokens after it: vLLM's `ngram` method with prompt_lookup_min 3, prompt_lookup_max 5,
num_speculative_tokens 5, run here as prompt lookup with ngram_min 3, ngram 5, γ 5); suffix decoding at its
defaults (vLLM's depth 24 and min_prob 0.1; factor 2, chosen by --tune, where vLLM's is 1; at most 16 nodes on a
CPU, where vLLM drafts up to 32). Interleaved repetitions, paired
ratios (bench/runner.py). Writes bench/results/suffix-<target>.{json,md}.

--tune chooses suffix_factor on the TUNING prompts (never scored): each prompt's greedy output is made once, then
every factor's drafter (and prompt lookup's) is replayed along it without the model (a greedy round accepts the
longest drafted branch that agrees with the output), each round priced by this machine's measured verification
cost t(n) (decoders/costs.py; a draft costs nothing). Writes bench/results/suffix-tune-<target>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import time

import math

from decoders import DecodeOptions, SuffixStore, generate, registry
from decoders.tree import children

from . import cli, report
from .__main__ import ASSETS, KIND_FILES, load_prompts
from .prompt_sets import load_humaneval
from .runner import Method, Prompt, ours, run_suite, set_threads

MULTI_TURN = "multi-turn"
SEED = 11
WRITE_MAX_CHARS = 700
REPLY = "Reply with the complete function in one Python code block."
TURNS = (  # what each turn of a chain asks for; {code} = the HumanEval prompt (signature and docstring)
    f"Complete the following Python function. {REPLY}\n\n```python\n{{code}}\n```",
    f"Complete the following Python function again, this time with type hints on its parameters and its return "
    f"value. {REPLY}\n\n```python\n{{code}}\n```",
    f"Complete the following Python function again and add a short comment above each block of statements. "
    f"{REPLY}\n\n```python\n{{code}}\n```",
)
TARGETS = {"code-editing": 1.2, MULTI_TURN: 1.2, "chat": 0.95}  # suffix ÷ the better prompt lookup, per kind
HEADLINE = "ours/suffix-cost"  # chosen by the lead before the scored run, from the tuning prompts' replay (--tune
# reports the cost-aware arms beside the factors it chooses from): at factor 2 it estimated 1.34× / 4.64× / 1.08× the baseline on code writing / editing / chat (the counts alone 1.32× / 4.64× / 1.06×)


def methods(factor: float = DecodeOptions.suffix_factor) -> list[Method]:
    return [ours("ours/baseline", "baseline", "baseline"),
            ours("ours/prompt-lookup", "prompt lookup · static γ=4", "prompt-lookup", rule="static", gamma=4),
            ours("ours/prompt-lookup-cost", "prompt lookup · cost-aware length", "prompt-lookup", rule="static",
                 controller="cost"),
            ours("ours/ngram-vllm", "vLLM-style n-gram · n 3–5, k 5", "prompt-lookup", rule="static", gamma=5,
                 ngram=5, ngram_min=3),
            ours("ours/suffix", f"suffix decoding · tree ≤16, factor {factor:g}, p ≥ 0.1", "suffix",
                 suffix_factor=factor),
            ours(HEADLINE, "suffix decoding · the same, cost-aware size", "suffix", suffix_factor=factor,
                 controller="cost")]



PROMPT_LOOKUPS = ("ours/prompt-lookup", "ours/prompt-lookup-cost")


# ---- the multi-turn set ---------------------------------------------------------------------------------------

def multi_turn_chains(n_chains: int, seed: int = SEED) -> tuple[list[list[Prompt]], dict]:
    """n_chains chains of len(TURNS) requests each, on HumanEval problems no other prompt set uses (drawn with a
    seeded generator), and the provenance for the results file."""
    problems, source = load_humaneval()
    used = {entry["source_id"] for name in KIND_FILES.values()
            for data in [json.loads((ASSETS / name).read_text(encoding="utf-8"))]
            for entry in data.get("tuning", []) + data.get("prompts", [])}
    pool = [p for p in problems if p["task_id"] not in used and len(p["prompt"]) <= WRITE_MAX_CHARS]
    chosen = random.Random(f"{seed}/{MULTI_TURN}").sample(pool, n_chains)
    chains = [[Prompt(f"turn{t + 1}-he{p['task_id'].split('/')[1]}", MULTI_TURN, template.format(code=p["prompt"].strip()))
               for t, template in enumerate(TURNS)] for p in chosen]
    return chains, {**source, "eligible": len(pool), "seed": seed, "task_ids": [p["task_id"] for p in chosen],
                    "turns": list(TURNS)}


def fill_stores(chains: list[list[Prompt]], target, max_new_tokens: int) -> list[Prompt]:
    """Each later turn gets a store of its chain's earlier greedy answers (made here, untimed); returns the later
    turns, the prompts the multi-turn rows score (a chain's first turn has nothing earlier to draw on)."""
    later = []
    for chain in chains:
        store = SuffixStore()
        for turn, prompt in enumerate(chain):
            prompt.ids = prompt.ids or target.encode_prompt(prompt.text, chat=True)
            if turn:
                prompt.store = SuffixStore.from_dict(store.to_dict())  # this turn's own copy: nothing it runs adds
                later.append(prompt)
            answer = generate(DecodeOptions(model=getattr(target, "name", "target"), max_new_tokens=max_new_tokens,
                                            record=False), prompt.ids, target=target)
            store.add(answer.output_ids)
    return later


# ---- the tables -----------------------------------------------------------------------------------------------

def rows(records: list[dict], chosen: list[Method], kind: str) -> list[dict]:
    """One row per method for one prompt kind: speed, the paired ratios to the baseline and to prompt lookup."""
    out = []
    for m in chosen:
        mine = [r for r in records if r["method"] == m.key and r["prompt_kind"] == kind]
        if not mine:
            continue
        same = [r["identical_to_baseline"] for r in mine if r.get("identical_to_baseline") is not None]
        out.append({"method": m.key, "label": m.label, "runs": len(mine),
                    "tok_s": report.median([r["tok_s"] for r in mine]),
                    "speedup": _ratio(records, m.key, "ours/baseline", kind),
                    "over_prompt_lookup": {ref: _ratio(records, m.key, ref, kind) for ref in PROMPT_LOOKUPS},
                    "tau": report.median([r["tau"] for r in mine]),
                    "drafted_per_round": report.median([r["drafted"] / max(1, len(r["rounds"])) for r in mine]),
                    "accepted_per_round": report.median([r["accepted"] / max(1, len(r["rounds"])) for r in mine]),
                    "identical": f"{sum(same)}/{len(same)}"})
    return out


def _ratio(records: list[dict], method: str, reference: str, kind: str):
    if method == reference:
        return None
    return report.ratio_over(records, method, reference, kinds=[kind])["median"]


def verdicts(tables: dict[str, list[dict]]) -> list[dict]:
    """Each suffix arm over the better prompt lookup of the same run, per kind, against the issue's targets (the
    headline arm first)."""
    out = []
    for arm in (HEADLINE, "ours/suffix"):  # the headline first
        for kind, goal in TARGETS.items():
            row = next((r for r in tables.get(kind, []) if r["method"] == arm), None)
            if row is None:
                continue
            ratios = [v for v in row["over_prompt_lookup"].values() if v is not None]
            worst = min(ratios) if ratios else None  # over the better prompt lookup: the smaller ratio
            out.append({"arm": arm, "label": row["label"], "kind": kind, "goal": goal, "ratio": worst,
                        "met": worst is not None and worst >= goal})
    return out


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Suffix decoding on {s['target']} ({s['dtype']}, CPU)", "",
             f"`{s['command']}` · {s['per_kind']} prompts per kind + {s['chains']} multi-turn chains × "
             f"{len(TURNS)} turns (turns 2–{len(TURNS)} scored) · {s['reps']} repetitions × {s['max_new_tokens']} new "
             f"tokens · greedy · {s['threads']} threads · {s['machine']} · {s['minutes']:.0f} min", "",
             "Ratios are medians over prompts of per-repetition paired ratios (same prompt, same repetition). "
             "τ = new tokens ÷ target forwards (prefill included). Drafted / accepted per round: per verification "
             "round. Suffix decoding's tree sends every drafted node; prompt lookup and the n-gram proposer send "
             "chains. The multi-turn rows' store holds the chain's earlier answers (the other methods cannot use "
             "it: they see only the prompt).", ""]
    for kind, table in result["tables"].items():
        lines += [f"## {kind}", "", "| method | tok/s | × baseline | × prompt lookup γ 4 | × prompt lookup "
                  "cost-aware | τ | drafted / round | accepted / round | equal to baseline |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in table:
            over = r["over_prompt_lookup"]
            lines.append(f"| {r['label']} | {_f(r['tok_s'], 1)} | {_f(r['speedup'])} | "
                         f"{_f(over['ours/prompt-lookup'])} | {_f(over['ours/prompt-lookup-cost'])} | "
                         f"{_f(r['tau'])} | {_f(r['drafted_per_round'], 1)} | {_f(r['accepted_per_round'], 1)} | "
                         f"{r['identical']} |")
        lines.append("")
    lines += ["## Targets (suffix decoding ÷ the better prompt lookup of the same run)", "",
              f"The headline arm, chosen before this run from the tuning prompts' replay (`--tune`): {HEADLINE}.", ""]
    for v in result["verdicts"]:
        lines.append(f"- {v.get('label', 'suffix decoding')} · {v['kind']}: {_f(v['ratio'])}× (target ≥ {v['goal']}×): "
                     f"{'met' if v['met'] else 'MISSED'}")
    lines += ["", f"Equal to the baseline: {result['identical']}.", ""]
    return "\n".join(lines)


def _f(x, digits=2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "–"


# ---- choosing the factor: a replay along greedy outputs -----------------------------------------------------

TUNE_FACTORS = (1.0, 2.0, 3.0, 4.0)


def replay(options: DecodeOptions, target, prompt_ids: list[int], output_ids: list[int], t, store=None) -> dict:
    """The rounds a greedy run with these options makes along its known output, without the model: each round's
    draft (the registry's drafter, the rule's limit) accepts its longest branch that agrees with the output, plus
    the target's own token. est_speedup = tokens ÷ Σ t(nodes sent + 1), the baseline costing t(1) = 1 a token."""
    drafter = registry.build_drafter(registry.BuildContext(options, None, target, None, store))
    priced = registry.RunCosts(t=lambda n: t(n, True), c=0.0) if options.controller == "cost" else None
    rule = registry.build_rule(options, priced)
    drafter.start(list(prompt_ids))
    ids, done, rounds, cost = list(prompt_ids), 0, 0, 0.0
    while done < len(output_ids):
        proposal = drafter.propose(ids, min(rule.limit(), len(output_ids) - done - 1), rule, None, None, False)
        tree = proposal.tree
        kids, node, path = children(tree.parents), 0, []
        while done + len(path) < len(output_ids) - 1:
            node = next((c for c in kids[node] if tree.tokens[c] == output_ids[done + len(path)]), None)
            if node is None:
                break
            path.append(node)
        kept, n_before = len(path), len(ids)
        ids += output_ids[done:done + kept + 1]
        drafter.observe(n_before, kept, path=path)
        done, rounds = done + kept + 1, rounds + 1
        rule.update(kept, tree.n_drafted)  # as the loop does (suffix: the drafter's observe() above calibrates)
        cost += t(tree.size, not tree.is_chain())
    drafter.close()
    return {"tau": len(output_ids) / rounds, "est_speedup": len(output_ids) / cost}


def tune_arms() -> dict[str, dict]:
    """Prompt lookup (the reference) and suffix decoding at each factor in TUNE_FACTORS, counts alone and with the
    cost controller (priced with the same t(n); a replay has no timings, so only t(n) and the calibration act)."""
    lookup = next(m for m in methods() if m.key == "ours/prompt-lookup")
    arms = {lookup.key: lookup.options}
    for factor in TUNE_FACTORS:
        arms[f"ours/suffix-f{factor:g}"] = {"method": "speculative", "drafter": "suffix", "suffix_factor": factor}
    for factor in TUNE_FACTORS:
        arms[f"ours/suffix-cost-f{factor:g}"] = {"method": "speculative", "drafter": "suffix", "suffix_factor": factor,
                                                "controller": "cost"}
    return arms


def tune(target, prompts: list[Prompt], max_new_tokens: int, t) -> dict:
    """Replay every arm along each tuning prompt's greedy output; per kind the geometric mean of est_speedup. The
    choice: among the factors that do not fall below prompt lookup on any kind (free text must not pay for the copy
    tasks' long drafts), the best geometric mean over the kinds (all factors, if none qualifies)."""
    arms, rows = tune_arms(), []
    name = getattr(target, "name", "target")
    for prompt in prompts:
        prompt.ids = prompt.ids or target.encode_prompt(prompt.text, chat=True)
        output = generate(DecodeOptions(model=name, max_new_tokens=max_new_tokens, record=False), prompt.ids,
                          target=target).output_ids
        for key, fields in arms.items():
            options = DecodeOptions(model=name, max_new_tokens=max_new_tokens, **fields)
            rows.append({"arm": key, "prompt": prompt.id, "kind": prompt.kind,
                         **replay(options, target, prompt.ids, output, t)})
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    table = {key: {kind: _geomean([r["est_speedup"] for r in rows if r["arm"] == key and r["kind"] == kind])
                   for kind in kinds} for key in arms}
    overall = {key: _geomean(list(by_kind.values())) for key, by_kind in table.items()}
    lookup = table["ours/prompt-lookup"]
    factors = [k for k in arms if k.startswith("ours/suffix-f")]  # the cost-aware arms are shown, not chosen from
    safe = [k for k in factors if all((table[k][kind] or 0) >= (lookup[kind] or 0) for kind in kinds)]
    best = max(safe or factors, key=lambda k: overall[k])
    return {"rows": rows, "estimates": table, "overall": overall, "best": best, "never_below_lookup": safe,
            "best_factor": arms[best]["suffix_factor"]}


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def tune_markdown(result: dict, settings: dict) -> str:
    kinds = list(next(iter(result["estimates"].values())))
    lines = [f"# Choosing suffix decoding's factor on {settings['target']} (tuning prompts, replayed)", "",
             f"`{settings['command']}` · {settings['prompts']} tuning prompts · {settings['max_new_tokens']} new "
             f"tokens · greedy · {settings['machine']} · t(1) {settings['step_ms']:.0f} ms (t(n) measured "
             f"{settings.get('curve_measured_at', '?')}, cached by decoders/costs.py)", "",
             "Estimated speed-up over the baseline (geometric mean per kind): each prompt's greedy output replayed "
             "through each arm's drafter without the model, every round priced by this machine's measured t(n) "
             "(tree masks for trees). An estimate for choosing, not a measurement: the scored comparison is "
             "`python -m bench.suffix`.", "",
             "| arm | " + " | ".join(kinds) + " | all kinds |", "|---|" + "---|" * (len(kinds) + 1)]
    for key, by_kind in result["estimates"].items():
        lines.append(f"| {key} | " + " | ".join(_f(by_kind[k]) for k in kinds) + f" | {_f(result['overall'][key])} |")
    safe = ", ".join(result.get("never_below_lookup") or []) or "none"
    lines += ["", f"Never below prompt lookup on any kind: {safe}. Chosen (the best of those over all kinds): "
              f"{result['best']} (suffix_factor {result['best_factor']:g}).", ""]
    return "\n".join(lines)


def run_tune(args, models: dict, started: float, threads: int, argv) -> int:
    from decoders import costs

    target = models["target"]
    curve = costs.measure(target, ns=costs.QUICK_NS)
    prompts = load_prompts(args.per_kind, cli.kinds(args), split="tuning")
    result = tune(target, prompts, args.max_new_tokens, curve.t)
    settings = {"target": args.target, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                "machine": f"{platform.processor() or platform.machine()}, {threads} threads",
                "command": cli.command("python -m bench.suffix", argv), "step_ms": curve.step_seconds * 1e3,
                "curve_measured_at": curve.measured_at,
                "minutes": (time.time() - started) / 60}
    text = tune_markdown(result, settings)
    stem = cli.out_stem(args)
    cli.write(stem.with_name(stem.name.replace("suffix-", "suffix-tune-", 1)), {"settings": settings, **result},
              text)
    print(text)
    return 0


# ---- the run --------------------------------------------------------------------------------------------------

def run(models: dict, prompts: list[Prompt], chains: list[list[Prompt]], reps: int, max_new_tokens: int,
        log=print, factor: float = DecodeOptions.suffix_factor) -> tuple[list[dict], dict[str, list[dict]]]:
    chosen = methods(factor)
    scored = prompts + fill_stores(chains, models["target"], max_new_tokens)
    records = run_suite(chosen, models, scored, reps, max_new_tokens, log=log)
    kinds = list(dict.fromkeys(p.kind for p in scored))
    return records, {kind: rows(records, chosen, kind) for kind in kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suffix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.run_arguments(parser, target="smollm2-135m", stem="suffix", reps=2)
    parser.add_argument("--chains", type=int, default=3, help="multi-turn chains (each len(TURNS) turns)")
    parser.add_argument("--tune", action="store_true", help="choose suffix_factor on the tuning prompts (replayed)")
    parser.add_argument("--suffix-factor", type=float, default=DecodeOptions.suffix_factor,
                        help="the suffix arm's factor (default: DecodeOptions'; --tune chooses one)")
    parser.set_defaults(max_new_tokens=64)  # whole functions: long enough for a repeated answer to pay
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    started = time.time()
    from decoders.runtime.models import load_model

    models = {"target": load_model(args.target, dtype="float32")}
    if args.tune:
        return run_tune(args, models, started, threads, argv)
    prompts = load_prompts(args.per_kind, cli.kinds(args))
    chains, provenance = multi_turn_chains(args.chains)
    records, tables = run(models, prompts, chains, args.reps, args.max_new_tokens, factor=args.suffix_factor)
    same = [r["identical_to_baseline"] for r in records if r.get("identical_to_baseline") is not None]
    result = {"settings": {"target": args.target, "dtype": "float32", "per_kind": args.per_kind, "chains": args.chains,
                           "suffix_factor": args.suffix_factor,
                           "reps": args.reps, "max_new_tokens": args.max_new_tokens, "threads": threads,
                           "machine": f"{platform.processor() or platform.machine()}",
                           "command": cli.command("python -m bench.suffix", argv),
                           "minutes": (time.time() - started) / 60, "multi_turn": provenance},
              "tables": tables, "identical": f"{sum(same)}/{len(same)}", "records": records}
    result["verdicts"] = verdicts(tables)
    text = markdown(result)
    cli.write(cli.out_stem(args), result, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
