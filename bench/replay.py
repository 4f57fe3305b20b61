"""python -m bench.replay FILE...: prompt lookup's per-round draft counts replayed into results files written before
the runner recorded them (bench/leviathan.py replay_file), and their tables rewritten where today's report
reproduces them. The command line lives here, not in bench/leviathan.py, because it renders with bench/report.py,
which imports bench/leviathan.py: one direction only.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import report
from .leviathan import replay_file


class _Encoder:
    """Prompt ids as bench/runner.py made them: the target's chat template (tokenizer only, no weights)."""

    def __call__(self, model: str, text: str) -> list[int]:
        from decoders.runtime.models import encode_prompt, load_tokenizer

        return encode_prompt(load_tokenizer(model).tokenizer, text, chat=True)

    def eos_ids(self, model: str) -> tuple[int, ...]:
        from decoders.runtime.models import load_tokenizer

        return load_tokenizer(model).eos_token_ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay",
                                     description="Replay prompt lookup's per-round draft counts into results files.")
    parser.add_argument("files", nargs="+", type=Path, help="results *.json written by python -m bench")
    args = parser.parse_args(argv)
    for path in args.files:
        if not path.is_file():
            raise SystemExit(f"no results file at {path}")
        md = path.with_suffix(".md")
        # the table is rewritten only where today's report reproduces it from the same file (the format of older
        # files has moved on; their JSON rows are refreshed, their tables stay as written)
        same_format = md.is_file() and report.markdown(json.loads(path.read_text())) == md.read_text()
        print(f"{path}: {replay_file(path, _Encoder())}")
        if same_format:
            md.write_text(report.markdown(json.loads(path.read_text())))
            print(f"  rewrote {md}")
        else:
            print(f"  left {md} as written (an older format)")


if __name__ == "__main__":
    main()
