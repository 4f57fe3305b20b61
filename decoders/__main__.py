"""Command line: `python -m decoders models` lists the registry; `python -m decoders run ...` decodes once.

    python -m decoders run --model qwen2.5-coder-1.5b --method speculative --drafter draft-model --rule adaedl \
        --prompt "Write a Python function that reverses a string." --max-new-tokens 64 --temperature 0 --trace out.json

Several --prompt (or --prompts-file) decode together as one batch (decoders/batch); --check-rows also decodes each
row alone and says whether the batched row equals it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .api import generate
from . import registry
from .runtime.buffers import KV_CACHES
from .options import BEAM_METHODS, CONTROLLERS, DRAFT_QUANTS, DTYPES, EARLY_STOPPING, DecodeOptions, OptionsError
from .trace import Trace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m decoders", description="SpecLab decoding from the shell")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("models", help="list the model registry")
    hub = commands.add_parser("hub-cache", help="write the registry's hub repos from the packaged weights into a "
                                                "Hugging Face cache (a Space's downloads, offline; decoders/hub_cache.py)")
    hub.add_argument("--hf-home", type=Path, required=True, help="the cache root (a Space run with HF_HOME=this)")
    hub.add_argument("--models", nargs="*", default=None, help="registry names (default: every LM and Whisper)")
    run = commands.add_parser("run", help="decode one prompt and print the text and a summary")
    defaults = DecodeOptions()
    run.add_argument("--model", default=defaults.model, help="registry name or hub id of the target")
    run.add_argument("--method", default=defaults.method, choices=list(registry.METHODS))
    run.add_argument("--drafter", default=defaults.drafter, choices=list(registry.DRAFTERS),
                     help="; ".join(f"{name}: {spec.help}" for name, spec in registry.DRAFTERS.items()))
    run.add_argument("--draft-model", default=None, help="draft model (default: the registry's pairing)")
    run.add_argument("--draft-quant", default=defaults.draft_quant, choices=DRAFT_QUANTS,
                     help="the draft model's linears: int8 where this CPU measured it faster (auto), always, or never")
    run.add_argument("--rule", default=defaults.rule, choices=list(registry.RULES), help="draft-length rule")
    run.add_argument("--gamma", type=int, default=defaults.gamma, help="static γ / heuristic start / lookup length")
    run.add_argument("--max-draft", type=int, default=defaults.max_draft, help="cap for adaptive rules")
    run.add_argument("--controller", default=defaults.controller, choices=CONTROLLERS,
                     help="cost: each round's cap maximises expected tokens per second on this machine's measured "
                          "verification cost (replaces γ / --max-draft)")
    run.add_argument("--lam", type=float, default=None, help="initial λ (AdaEDL 0.5, max-confidence 0.4)")
    run.add_argument("--skip-layers", default=None, help="layer-skip: comma-separated layer indices, e.g. 9,11,13")
    run.add_argument("--ngram", type=int, default=defaults.ngram, help="prompt lookup: longest n-gram")
    run.add_argument("--ngram-min", type=int, default=defaults.ngram_min, help="prompt lookup: shortest n-gram")
    run.add_argument("--suffix-depth", type=int, default=defaults.suffix_depth,
                     help="suffix: the suffix tree's depth (longest matched tail + what follows)")
    run.add_argument("--suffix-tokens", type=int, default=defaults.suffix_tokens, help="suffix: most drafts per round")
    run.add_argument("--suffix-factor", type=float, default=defaults.suffix_factor,
                     help="suffix: a matched tail of L tokens earns at most floor(factor x L) drafts")
    run.add_argument("--suffix-min-prob", type=float, default=defaults.suffix_min_prob,
                     help="suffix: draft a continuation only if its count-estimated probability is at least this")
    run.add_argument("--width", type=int, default=defaults.width, help="beam methods: beams (DSBD: W)")
    run.add_argument("--min-width", type=int, default=defaults.min_width, help="DSBD: narrowest layer")
    run.add_argument("--thres", type=float, default=defaults.thres, help="DSBD: width confidence")
    run.add_argument("--one-input-beam", action="store_true", help="DSBD memory mode: one beam between iterations")
    run.add_argument("--length-penalty", type=float, default=defaults.length_penalty, help="beam search")
    run.add_argument("--early-stopping", default=defaults.early_stopping, choices=EARLY_STOPPING, help="beam search")
    run.add_argument("--tree-k", type=int, default=defaults.tree_k, help="eagle2/ddd: children per expanded node (K)")
    run.add_argument("--tree-depth", type=int, default=defaults.tree_depth, help="eagle2: expansion steps (D)")
    run.add_argument("--tree-m", type=int, default=defaults.tree_m, help="eagle2/ddd: draft nodes verified (M)")
    run.add_argument("--ddd-checks", default=",".join(map(str, defaults.ddd_checks)),
                     help="ddd: expansion steps where confidence is checked (S)")
    run.add_argument("--ddd-x", type=float, default=defaults.ddd_x, help="ddd: stop below this confidence H")
    run.add_argument("--ddd-steps", type=int, default=defaults.ddd_steps, help="ddd: most expansion steps (n)")
    run.add_argument("--ddd-width", type=int, default=defaults.ddd_width, help="ddd: frontier kept per step (w)")
    run.add_argument("--tree-paths", default=None, help="eagle1: the static tree as rank paths separated by ';', "
                     "e.g. '0;1;0,0;0,1' (default: SpecLab's 24-node tree)")
    run.add_argument("--eagle-head", default=None, help="tree drafters: grow from an EAGLE head (a folder, a hub id, "
                     "or auto) instead of the draft model")
    run.add_argument("--self-weights", default="auto", help="early-exit / prophet: trained weights folder, or auto "
                     "(the shipped or trained ones for --model)")
    run.add_argument("--prompt", action="append", default=None,
                     help="the prompt; repeat it to decode several prompts together as one batch (decoders/batch)")
    run.add_argument("--prompts-file", type=Path, default=None,
                     help="a batch of prompts: one per line (blank lines skipped), or a .json list of strings")
    run.add_argument("--seeds", default=None, help="batch: one seed per prompt, comma-separated (default: --seed)")
    run.add_argument("--check-rows", action="store_true", help="batch: also decode each prompt alone and print, "
                     "per row, whether the batched row equals it (decoders/compare.py's rounding-vs-mismatch line)")
    run.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    run.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    run.add_argument("--temperature", type=float, default=defaults.temperature, help="0 = greedy")
    run.add_argument("--top-k", type=int, default=defaults.top_k)
    run.add_argument("--top-p", type=float, default=defaults.top_p)
    run.add_argument("--seed", type=int, default=defaults.seed)
    run.add_argument("--dtype", default=defaults.dtype, choices=DTYPES)
    run.add_argument("--device", default=defaults.device, help="auto | cpu | cuda")
    run.add_argument("--kv-cache", default=defaults.kv_cache, choices=KV_CACHES,
                     help="dynamic | static | fixed (bucketed shapes) | auto (dynamic; fixed with --cuda-graphs)")
    run.add_argument("--cuda-graphs", action="store_true", help="replay fixed-shape forwards as CUDA graphs (GPU)")
    run.add_argument("--no-record", action="store_true", help="keep counters only (tokens are identical)")
    run.add_argument("--trace", type=Path, default=None, help="write the trace JSON here")
    run.add_argument("--compare-baseline", action="store_true", help="also decode the baseline and print one line: "
                     "same as baseline, or where it differs and whether that is rounding or a mismatch")
    return parser


def options_from(args: argparse.Namespace) -> DecodeOptions:
    skip = _integers("--skip-layers", args.skip_layers) if args.skip_layers else None
    tree = dict(tree_k=args.tree_k, tree_depth=args.tree_depth, tree_m=args.tree_m, ddd_x=args.ddd_x,
                ddd_steps=args.ddd_steps, ddd_width=args.ddd_width, eagle_head=args.eagle_head,
                self_weights=args.self_weights, suffix_depth=args.suffix_depth, suffix_tokens=args.suffix_tokens,
                suffix_factor=args.suffix_factor, suffix_min_prob=args.suffix_min_prob,
                ddd_checks=_integers("--ddd-checks", args.ddd_checks),
                tree_paths=tuple(_integers("--tree-paths", p) for p in args.tree_paths.split(";") if p.strip())
                if args.tree_paths else None)
    return DecodeOptions(model=args.model, method=args.method, drafter=args.drafter, draft_model=args.draft_model,
                         rule=args.rule, gamma=args.gamma, max_draft=args.max_draft, lam=args.lam, skip_layers=skip,
                         controller=args.controller, draft_quant=args.draft_quant,
                         ngram=args.ngram, ngram_min=args.ngram_min, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed, record=not args.no_record,
                         dtype=args.dtype, device=args.device, kv_cache=args.kv_cache,
                         cuda_graphs=args.cuda_graphs, chat=not args.no_chat, width=args.width,
                         min_width=args.min_width, thres=args.thres, one_input_beam=args.one_input_beam,
                         length_penalty=args.length_penalty, early_stopping=args.early_stopping, **tree)


def _integers(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise OptionsError(f"{flag} takes comma-separated integers, got {text!r}") from None


def summary_line(trace: Trace) -> str:
    t = trace.totals
    if trace.method in BEAM_METHODS:
        speed = "n/a" if t["tokens_per_second"] is None else f"{t['tokens_per_second']:.1f}"
        return (f"[{trace.label}] tokens={t['tokens']} target_forwards={t['target_forwards']} "
                f"draft_forwards={t['draft_forwards']} peak_kv={t['peak_kv_bytes'] / 2**20:.2f}MiB tok/s={speed} "
                f"candidates={len(trace.candidates)} stop={trace.stop_reason}")
    rate = "n/a" if t["acceptance_rate"] is None else f"{t['acceptance_rate']:.2f}"
    speed = "n/a" if t["tokens_per_second"] is None else f"{t['tokens_per_second']:.1f}"
    return (f"[{trace.label}] tokens={t['tokens']} target_forwards={t['target_forwards']} "
            f"tau={t['tau']:.2f} acceptance={rate} tok/s={speed} stop={trace.stop_reason} "
            f"dtype={trace.models['target']['dtype']}")


def baseline_line(trace: Trace) -> str:
    """decoders/compare.py's one line, with the two differing tokens' text."""
    from .compare import Comparison

    check = Comparison(**trace.baseline_check)
    if check.position is None or not trace.models.get("target"):
        return check.line()
    from .runtime.models import load_tokenizer

    decode = load_tokenizer(trace.models["target"]["name"]).tokenizer.decode
    return check.line((decode([check.baseline_token]), decode([check.run_token])))


def prompts_from(args: argparse.Namespace) -> list[str]:
    """--prompt (repeatable) and --prompts-file, in that order."""
    prompts = list(args.prompt or [])
    if args.prompts_file is not None:
        prompts += read_prompts(args.prompts_file)
    if not prompts:
        raise OptionsError("give a prompt: --prompt TEXT (repeat it for a batch) or --prompts-file FILE")
    return prompts


def read_prompts(path: Path) -> list[str]:
    import json

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise OptionsError(f"cannot read --prompts-file {path}: {err.strerror}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise OptionsError(f"{path} is not valid JSON ({err.msg}, line {err.lineno}); give a list of strings "
                               "or a text file with one prompt per line") from None
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise OptionsError(f"{path} must hold a JSON list of prompt strings")
        return data
    return [line for line in text.splitlines() if line.strip()]


def run_batch(options, prompts: list[str], args: argparse.Namespace) -> int:
    """Decode the prompts as one batch; print each row, its summary, and the batch's totals."""
    from dataclasses import replace

    from .api import generate_batch
    from .compare import compare

    seeds = list(_integers("--seeds", args.seeds)) if args.seeds else None
    batch = generate_batch(options, prompts, seeds=seeds)
    mismatch = False
    for r, trace in enumerate(batch):
        print(f"--- row {r}")
        print(trace.output_text)
        print(summary_line(trace))
        if args.check_rows:
            alone = generate(replace(options, seed=seeds[r] if seeds else options.seed), prompts[r])
            same = trace.output_ids == alone.output_ids
            verdict = None if same else compare(trace, alone, _target(options).model)
            print("same as this row decoded alone" if same else
                  f"against this row decoded alone: {verdict.line()}" if verdict.kind == "rounding" else
                  "differs from this row decoded alone: mismatch (with its own seed a sampled row must draw exactly "
                  "what it draws alone)" if verdict.kind == "sampled" else
                  f"differs from this row decoded alone: {verdict.line()}")
            mismatch |= not same and verdict.kind != "rounding"
    print(batch_line(batch))
    if args.trace:
        args.trace.write_text(batch.to_json(indent=1), encoding="utf-8")
        print(f"batch trace written to {args.trace}")
    return 1 if mismatch else 0


def _target(options):
    """The run's target (a cache hit: the batch and the row alone have just loaded it) for compare's re-score."""
    from . import api

    return api._load(options.model, options)


def batch_line(batch) -> str:
    t = batch.totals
    speed = "n/a" if t["tokens_per_second"] is None else f"{t['tokens_per_second']:.1f}"
    share = "n/a" if t["realign_share"] is None else f"{100 * t['realign_share']:.1f}%"
    taus = " ".join("-" if x is None else f"{x:.2f}" for x in t["tau"])
    return (f"[{batch.label}] rows={t['batch']} tokens={t['tokens']} rounds={t['rounds']} total tok/s={speed} "
            f"realign={share} tau per row: {taus}")


def list_models() -> None:
    from .runtime.models import describe_models

    for row in describe_models():
        state = "installed" if row["installed"] else "hub only"
        pair = f" draft={row['default_draft']}" if row.get("default_draft") else ""
        print(f"{row['name']:<22} {row['role']:<7} {state:<10}{pair}  {row['description']}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .runtime.models import ModelError

    try:
        if args.command == "models":
            list_models()
            return 0
        if args.command == "hub-cache":
            from .hub_cache import write_hub_cache

            print("\n".join(write_hub_cache(args.hf_home, args.models)))
            return 0
        options = options_from(args).validate()
        prompts = prompts_from(args)
        if len(prompts) > 1 or args.prompts_file is not None:
            return run_batch(options, prompts, args)
        trace = generate(options, prompts[0], compare_baseline=args.compare_baseline)
    except (OptionsError, ModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(trace.output_text)
    print(summary_line(trace))
    if getattr(trace, "baseline_check", None) is not None:  # a beam method's trace has no baseline check
        print(baseline_line(trace))
        if trace.baseline_check["kind"] == "mismatch":
            return 1  # a real disagreement with the baseline is a bug, not a result
    if args.trace:
        args.trace.write_text(trace.to_json(indent=1), encoding="utf-8")
        print(f"trace written to {args.trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
