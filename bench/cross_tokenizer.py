"""A draft with another tokenizer: SpecLab's cross-tokenizer drafter against transformers' universal assisted
generation (UAG), the same pair and the same draft object on both sides.

    python -m bench.cross_tokenizer                          # SmolLM2-135M drafting for Qwen2.5-Coder-1.5B, float32
    python -m bench.cross_tokenizer --draft-quant int8       # both sides on one int8 draft
    python -m bench.cross_tokenizer --per-kind 1 --reps 1 --max-new-tokens 24   # a short smoke run

Arms, on each scored prompt (ShareGPT chat, HumanEval code writing and code editing) × repetitions, in an order
that rotates between repetitions and prompts, greedy (temperature 0):
  ours/baseline      SpecLab's baseline: the reference every output must equal
  ours/xtok-cost     the cross-tokenizer drafter, AdaEDL under the cost-aware cap (the headline, chosen in advance)
  ours/xtok-adaedl   the same with AdaEDL's own cap, L_max 8
  ours/xtok-static   the same with a fixed γ 4
  hf/greedy          transformers' greedy generate
  hf/uag             generate(assistant_model=draft, tokenizer=target's, assistant_tokenizer=draft's): transformers'
                     defaults (20 tokens, confidence 0.4, constant), its lookbehind windows 10 / 10
  hf/uag-5           the same with 5 tokens, confidence 0.2, heuristic (the setting bench.controller's grid chose
                     for the same-tokenizer Qwen pair)
Both sides run on SpecLab's packed float32 kernels for the target; the draft is one loaded object, float32 or int8
(decoders/quantize.py), handed to both. Sampling is not raced: transformers' sampled UAG (its
UniversalSpeculativeDecodingGenerator) prunes the draft's LM head in place, which would change the draft the
other arms use. Speeds: the steady decode tokens/s after the first round on both sides (bench/runner.py, peers.py);
a ratio is the median over prompts of the per-repetition paired ratio. Writes
bench/results/cross-tokenizer-<target>.{json,md}.

Shared bench helpers used: runner (Method, ours, Prompt, run_ours, rotate, mark_identity, set_threads), peers
(the streamer, call counters and figures behind every transformers arm), report (ratio_over, median, _f,
_kind_order), cli (arguments, prompts' kinds, output files), __main__ (load_prompts, machine).
"""
from __future__ import annotations

import argparse
import platform
import time

import torch

from decoders.runtime import kernels

from . import cli, peers, report
from .__main__ import load_prompts, machine
from .runner import Method, Prompt, mark_identity, ours, rotate, run_ours, set_threads

HEADLINE = "ours/xtok-cost"
UAG = {"hf/uag": dict(peers.ASSISTED_DEFAULTS),
       "hf/uag-5": {"num_assistant_tokens": 5, "assistant_confidence_threshold": 0.2,
                    "num_assistant_tokens_schedule": "heuristic"}}
TARGET = 1.1  # the issue's bar: the headline ≥ 1.1× transformers' UAG with the same pair


def methods() -> list[Method]:
    """Every arm; SpecLab's draft is the loaded object itself (draft_quant "none": never quantized again)."""
    same = dict(draft_quant="none")
    return [ours("ours/baseline", "SpecLab baseline", "baseline"),
            ours(HEADLINE, "SpecLab cross-tokenizer · AdaEDL · cost-aware cap", "cross-tokenizer", rule="adaedl",
                 controller="cost", **same),
            ours("ours/xtok-adaedl", "SpecLab cross-tokenizer · AdaEDL L_max 8", "cross-tokenizer", rule="adaedl",
                 max_draft=8, **same),
            ours("ours/xtok-static", "SpecLab cross-tokenizer · static γ 4", "cross-tokenizer", rule="static",
                 gamma=4, **same),
            Method("hf/greedy", "transformers greedy", "hf", "greedy"),
            *(Method(key, f"transformers UAG ({_settings_label(settings)})", "hf", "uag", settings)
              for key, settings in UAG.items())]


def _settings_label(settings: dict) -> str:
    return (f"{settings['num_assistant_tokens']} tokens, confidence {settings['assistant_confidence_threshold']}, "
            f"{settings['num_assistant_tokens_schedule']}")


@torch.inference_mode()
def run_uag(target, draft, prompt_ids: list[int], max_new_tokens: int, settings: dict) -> dict:
    """One transformers generate call with a draft of another tokenizer, timed like every peer (bench/peers.py)."""
    model = target.model
    ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)  # (1, P)
    eos = list(target.eos_token_ids) or None
    streamer = peers._TimingStreamer()
    calls = {"target": peers._CallCounter(model), "draft": peers._CallCounter(draft.model)}
    try:
        with peers.assistant_config(draft.model, settings):
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, temperature=None, top_p=None, top_k=None, num_beams=1,
                                 eos_token_id=eos, pad_token_id=eos[0] if eos else 0, streamer=streamer,
                                 assistant_model=draft.model, tokenizer=target.tokenizer,
                                 assistant_tokenizer=draft.tokenizer)
            end = time.perf_counter()
    finally:
        for counter in calls.values():
            counter.close()
    output = out[0, len(prompt_ids):].tolist()
    result = peers._figures(output, streamer.events, start, end, calls["target"].sizes, calls["draft"].sizes,
                            len(prompt_ids), "assisted")
    result["target_call_sizes"] = list(calls["target"].sizes)
    return result


def run_arm(method: Method, models: dict, prompt: Prompt, max_new_tokens: int) -> dict:
    target, draft = models["target"], models["draft"]
    if method.family == "ours":
        result = run_ours(method, target, prompt, max_new_tokens, draft)
    elif method.kind == "uag":
        result = run_uag(target, draft, prompt.ids, max_new_tokens, method.options)
    else:
        result = peers.run_peer("greedy", target, prompt.ids, max_new_tokens)
    result.update({"method": method.key, "family": method.family, "label": method.label, "kind": method.kind,
                   "temperature": 0.0, "prompt": prompt.id, "prompt_kind": prompt.kind,
                   "prompt_tokens": len(prompt.ids)})
    return result


def run_all(arms: list[Method], models: dict, prompts: list[Prompt], reps: int, max_new_tokens: int,
            log=print, warmup: bool = True) -> list[dict]:
    """Every arm on every prompt, `reps` times, the order rotating; a warm-up call per arm first."""
    for prompt in prompts:
        prompt.ids = prompt.ids or models["target"].encode_prompt(prompt.text, chat=True)
    if warmup:
        for arm in arms:
            run_arm(arm, models, prompts[0], min(4, max_new_tokens))
    records, total = [], reps * len(prompts) * len(arms)
    for rep in range(reps):
        for p_index, prompt in enumerate(prompts):
            for arm in rotate(arms, rep * len(prompts) + p_index):
                result = run_arm(arm, models, prompt, max_new_tokens)
                result["rep"] = rep
                records.append(result)
                log(f"  [{len(records)}/{total}] rep {rep} {prompt.id:<16} {arm.key:<18} "
                    f"{report._f(result['tok_s'])} tok/s  τ {report._f(result['tau'])}")
    mark_identity(records)
    return records


def rows(records: list[dict], arms: list[Method]) -> list[dict]:
    """Per arm and prompt kind: speed-up over SpecLab's baseline and over each UAG arm, τ, acceptance, equality."""
    kinds = sorted({r["prompt_kind"] for r in records}, key=report._kind_order)
    out = []
    for arm in arms:
        for kind in kinds + ["all"]:
            chosen = None if kind == "all" else (kind,)
            mine = [r for r in records if r["method"] == arm.key and kind in ("all", r["prompt_kind"])]
            if not mine:
                continue
            same = [r["identical_to_baseline"] for r in mine if r.get("identical_to_baseline") is not None]
            out.append({"method": arm.key, "label": arm.label, "kind": kind,
                        "tok_s": report.median([r["tok_s"] for r in mine]),
                        "speedup": _ratio(records, arm.key, "ours/baseline", chosen),
                        **{f"vs_{key}": _ratio(records, arm.key, key, chosen) for key in UAG},
                        "tau": report.median([r["tau"] for r in mine]),
                        "acceptance": report.median([r.get("acceptance_rate") for r in mine]),
                        "identical": f"{sum(same)}/{len(same)}" if same else "–"})
    return out


def _ratio(records: list[dict], method: str, reference: str, kinds) -> float | None:
    if method == reference:
        return None
    return report.ratio_over(records, method, reference, kinds)["median"]


def verdict(table: list[dict]) -> str:
    """The headline against the faster UAG arm, over all prompts, and whether every output equalled the baseline."""
    row = next((r for r in table if r["method"] == HEADLINE and r["kind"] == "all"), None)
    if row is None:
        return "The headline arm did not run."
    ratios = [row[f"vs_{key}"] for key in UAG if row.get(f"vs_{key}") is not None]
    worst = min(ratios) if ratios else None
    equal = all(r["identical"].split("/")[0] == r["identical"].split("/")[-1] for r in table
                if r["kind"] == "all" and r["identical"] != "–")
    met = worst is not None and worst >= TARGET
    return (f"Headline ({row['label']}) vs the faster transformers UAG arm: {report._f(worst, 2, '×')} (target ≥ "
            f"{TARGET}×: {'met' if met else 'not met'}); every greedy output equal to SpecLab's baseline: "
            f"{'yes' if equal else 'no'}.")


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Cross-tokenizer drafting: {s['draft']} for {s['target']} ({s['draft_precision']} draft, "
             f"{s['machine']})", "",
             f"`{s['command']}` · {s['prompts']} scored prompts × {s['reps']} repetitions × {s['max_new_tokens']} new "
             f"tokens · {s['threads']} threads · {s['minutes']:.0f} min · machine: {s['load']}", "",
             "Speed-up: median over prompts of the per-repetition ratio of steady decode tokens/s to SpecLab's "
             "baseline. vs UAG / vs UAG-5: the same ratio against transformers' universal assisted generation "
             "with the same draft object (defaults; 5 tokens, confidence 0.2, heuristic). τ: new tokens per target "
             "call, the prefill call included on both sides. Same as baseline: greedy outputs equal to SpecLab's "
             "baseline, token for token.", "", verdict(result["rows"]), "",
             "| method | kind | tok/s | speed-up | vs UAG | vs UAG-5 | τ | acceptance | same as baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r['kind']} | {report._f(r['tok_s'])} | {report._f(r['speedup'], 2, '×')} | "
                     f"{report._f(r['vs_hf/uag'], 2, '×')} | {report._f(r['vs_hf/uag-5'], 2, '×')} | "
                     f"{report._f(r['tau'])} | {report._f(r['acceptance'])} | {r['identical']} |")
    return "\n".join(lines) + "\n"


def load_models(target: str, draft: str, quant: str) -> dict:
    """Target and draft, float32; the draft int8 when asked (one object, handed to both sides)."""
    from decoders.runtime.models import load_model

    models = {"target": load_model(target, dtype="float32"),
              "draft": load_model(draft, dtype="float32", quant="int8" if quant == "int8" else None)}
    kernels.use(models["target"].model, kernels.PACKED)
    return models


def _load() -> str:
    try:
        with open("/proc/loadavg") as handle:
            return "load average " + " / ".join(handle.read().split()[:3]) + " (1 / 5 / 15 min)"
    except OSError:
        return "load average unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cross_tokenizer", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="qwen2.5-coder-1.5b", reps=2, stem="cross-tokenizer")
    parser.add_argument("--draft", default="smollm2-135m", help="the draft model (another tokenizer)")
    parser.add_argument("--draft-quant", choices=("none", "int8"), default="none",
                        help="the draft's linears, the same object for both sides")
    args = parser.parse_args(argv)
    if args.draft_quant == "int8":
        args.stem += "-int8"  # bench/results/cross-tokenizer-int8-<target>: the float32 run's file stays
    threads = set_threads(args.threads)
    began = time.monotonic()
    models = load_models(args.target, args.draft, args.draft_quant)
    prompts = load_prompts(args.per_kind, cli.kinds(args))
    arms = methods()
    load_before = _load()
    records = run_all(arms, models, prompts, args.reps, args.max_new_tokens)
    result = {"settings": {"target": args.target, "draft": args.draft, "prompts": len(prompts), "reps": args.reps,
                           "draft_precision": "int8" if args.draft_quant == "int8" else "float32",
                           "max_new_tokens": args.max_new_tokens, "threads": threads, "machine": machine(),
                           "load": f"{load_before} before, {_load()} after", "torch": torch.__version__,
                           "platform": platform.platform(),
                           "command": cli.command("python -m bench.cross_tokenizer", argv),
                           "minutes": (time.monotonic() - began) / 60},
              "uag_settings": UAG, "rows": rows(records, arms), "records": records}
    cli.write(cli.out_stem(args), result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
