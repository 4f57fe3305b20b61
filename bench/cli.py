"""What the bench scripts' command lines share: the run's arguments, the registry pair, the prompts, the files.

    parser = argparse.ArgumentParser(prog="python -m bench.trees")
    run_arguments(parser, target="smollm2-135m", reps=2, stem="trees")
    args = parser.parse_args(argv)
    models, draft_name = load_pair(args.target)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import RESULTS

KINDS = "chat,code-writing,code-editing"


def run_arguments(parser: argparse.ArgumentParser, *, target: str, stem: str, reps: int | None = None,
                  prompts: bool = True) -> None:
    """--target, [--per-kind, --kinds, --reps], --max-new-tokens, --threads, --out (bench/results/<stem>-<target>)."""
    parser.add_argument("--target", default=target)
    if prompts:
        parser.add_argument("--per-kind", type=int, default=2, help="scored prompts per kind")
        parser.add_argument("--kinds", default=KINDS)
    if reps is not None:
        parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help=f"output stem (default bench/results/{stem}-<target>)")
    parser.set_defaults(stem=stem)


def kinds(args: argparse.Namespace) -> list[str]:
    return [k.strip() for k in args.kinds.split(",") if k.strip()]


def out_stem(args: argparse.Namespace) -> Path:
    """The results stem, kept whole (a model name like qwen2.5-coder-1.5b has dots in it)."""
    stem = Path(args.out) if args.out else RESULTS / f"{args.stem}-{args.target}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    return stem


def command(prog: str, argv: list[str] | None) -> str:
    """The command line as typed, for the results file."""
    return " ".join([prog, *(argv if argv is not None else sys.argv[1:])])


def load_pair(target: str) -> tuple[dict, str | None]:
    """{"target": lm[, "draft": lm]} in float32 and the draft's registry name (None: the target has no draft)."""
    from decoders.runtime.models import REGISTRY, load_model

    entry = REGISTRY.get(target)
    draft_name = entry.default_draft if entry is not None else None
    models = {"target": load_model(target, dtype="float32")}
    if draft_name:
        models["draft"] = load_model(draft_name, dtype="float32")
    return models, draft_name


def write(stem: Path, result: dict, markdown: str) -> None:
    """stem.json (every record) and stem.md (the table a reader reads)."""
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    Path(f"{stem}.md").write_text(markdown, encoding="utf-8")
