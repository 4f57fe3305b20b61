"""Choose the Race tab's default prompt by measurement (results: bench/results/race-defaults.md): each candidate raced exactly as the Race tab races it.

    python -m bench.race_defaults [--tokens 48] [--out FILE.json]      # a timing run: alone on the machine

For every candidate prompt: the baseline and the default methods (app/tabs/race/runs.py DEFAULT_METHODS), each a
warm-up plus TIMED_RUNS timed runs in one hold of the decode slot (runs.race_runs), then the table's row for each
(speed-up over the baseline, τ, acceptance, identical output), how many rounds drafted (and how many had a cost-aware
cap of 0) and the load measured during its timed runs (app/tabs/race/load.py). Prints one line per method and writes
JSON with the date; the Race tab's intro quotes the repeat-list rows (app/tabs/race/intro.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import torch

from app.figures.race import race_row
from app.shared.loading import loaded
from app.tabs.race import runs as race
from app.tabs.race.load import load_words
from app.tabs.race.verdicts import round_facts
from decoders.trace import Trace

from . import cli
from .common import LoadMeter

CANDIDATES = {
    "rename-variable": "Rewrite this code with the variable `x` renamed to `total`, and change nothing else:\n\n"
                       "def add_all(values):\n    x = 0\n    for v in values:\n        x = x + v\n    return x\n",
    "repeat-list": "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape.",
    "add-type-hints": "Add type hints to this function and change nothing else:\n\n"
                      "def scale(points, factor):\n    result = []\n    for point in points:\n"
                      "        result.append((point[0] * factor, point[1] * factor))\n    return result\n",
    "sky-blue (free text)": "Explain in three short sentences why the sky is blue.",
}


def measure(prompt: str, tokens: int, methods: list[str]) -> list[dict]:
    runs = race.race_options({"model": "smollm2-135m", "dtype": "auto", "methods": methods, "max_new_tokens": tokens,
                              "temperature": 0.0, "seed": 0})
    with loaded(*runs):
        traces = [Trace.from_dict(d) for d in race.race_runs([o.to_dict() for o in runs], prompt)
                  if "running" not in d and "waiting" not in d]  # the race's ticks and waiting lines: no trace
    rows = [{**race_row(t, traces[0]), **round_facts(t)} for t in traces]  # round_facts: rounds, idle causes, load
    return [{k: row.get(k) for k in ("label", "tokens_per_second", "speedup", "spread", "tau", "acceptance_rate",
                                     "gamma", "identical", "rounds", "drafting", "cap_zero", "no_match", "load")}
            for row in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.race_defaults")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    parser.add_argument("--out", default="", help="FILE.json: the rows, and FILE.md beside it")
    args = parser.parse_args(argv)
    names = [n for n in CANDIDATES if not args.only or n in args.only.split(",")]
    load = LoadMeter().start()
    results = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "tokens": args.tokens,
               "methods": race.DEFAULT_METHODS, "command": cli.command("python -m bench.race_defaults", argv),
               "prompts": {}}
    for name in names:
        rows = measure(CANDIDATES[name], args.tokens, race.DEFAULT_METHODS)
        results["prompts"][name] = rows
        for row in rows:
            spread = row["spread"] and f"{row['spread'][0]:.1f}-{row['spread'][1]:.1f}"
            print(f"{name:22s} {row['label'][:48]:48s} {row['tokens_per_second']:6.1f} tok/s [{spread}] "
                  f"x{row['speedup'] or 0:.2f} tau {row['tau'] or 0:.2f} acc {row['acceptance_rate'] or 0:.2f} "
                  f"gamma {row['gamma']:.1f} identical {row['identical']} drafting {row['drafting']}/{row['rounds']} "
                  f"cap0 {row['cap_zero']} load {load_words(row['load'])}", flush=True)
    results["load"] = load.stop()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
        Path(args.out).with_suffix(".md").write_text(markdown(results), encoding="utf-8")


def markdown(results: dict) -> str:
    """The table of a run, headed by the command as typed (the process's own arguments: a lock or nice wrapped
    around it is not part of it) and the machine's measured load."""
    lines = ["# Race defaults: candidate prompts raced as the Race tab races them", "",
             f"`{results['command']}` · {results['date']} · smollm2-135m, auto (float32), greedy, {results['tokens']} "
             f"new tokens · {results['machine']} · each method a warm-up then 3 timed runs (median; range in "
             f"brackets) · {results['load']['label']}: compare within a prompt.", "",
             "| prompt | method | tokens/s (median) [range] | × baseline | τ | acceptance | γ | identical to "
             "baseline |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in results["prompts"].items():
        for row in rows:
            spread = f" [{row['spread'][0]:.1f}–{row['spread'][1]:.1f}]" if row["spread"] else ""
            accept = f"{row['acceptance_rate']:.0%}" if row["acceptance_rate"] is not None else "–"
            lines.append(f"| {name} | {row['label']} | {row['tokens_per_second']:.1f}{spread} | "
                         f"{row['speedup'] or 0:.2f} | {row['tau'] or 0:.2f} | {accept} | {row['gamma']:.1f} | "
                         f"{'yes' if row['identical'] else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
