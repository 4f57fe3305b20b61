"""Record the run the page opens on and the baseline beside it, so the first page shows what "faster" means.

    flock /tmp/speclab-heavy.lock .venv/bin/python -m bench.record_opening

Both come from one process on the same loaded models, one right after the other: an 8-token warm-up of each, then the
baseline, then the opening method (OPENING_OPTIONS on OPENING_PROMPT below: SmolLM2 drafting trees from a suffix tree
of the prompt and its own output on a code-editing prompt, which wins on a 2-core CPU and loads in seconds on a CPU
Space; the baseline gets the same model, prompt, dtype, chat template and token budget). Each trace keeps totals["recorded"]: the machine, the date and
the load measured while it ran (app/tabs/race/load.py), which the Generate tab's opening line quotes beside both speeds.
"""
from __future__ import annotations

import argparse
import datetime
from dataclasses import replace
from pathlib import Path

import torch

from app.tabs.generate.controls import OPENING_BASELINE, OPENING_PATH
from app.tabs.race import load as machine_load
from decoders import DecodeOptions, generate
from decoders.costs import machine_description

from .race_defaults import CANDIDATES

BASELINE_PATH = OPENING_PATH.with_name(OPENING_BASELINE)
WARMUP_TOKENS = 8
# The run the page opens on: what the app teaches first (a tree of drafts checked in one target pass, output unchanged),
# on the model a CPU Space loads in seconds. Greedy, no cost controller: Run repeats the recording token for token and
# draft for draft. On this prompt suffix decoding reached τ 3.4 (prompt lookup 2.8; race-defaults.md: prompt lookup
# 1.8-1.9x the baseline here).
OPENING_OPTIONS = DecodeOptions(model="smollm2-135m", method="speculative", drafter="suffix", controller="off",
                                dtype="float32", max_new_tokens=64, temperature=0.0, record=True)
OPENING_PROMPT = CANDIDATES["add-type-hints"]


def baseline_of(options: DecodeOptions) -> DecodeOptions:
    """The baseline of a recorded run: the same model, dtype, prompt handling and budget, greedy or seeded alike."""
    return DecodeOptions(model=options.model, method="baseline", dtype=options.dtype, device=options.device,
                         max_new_tokens=options.max_new_tokens, temperature=options.temperature, top_k=options.top_k,
                         top_p=options.top_p, seed=options.seed, chat=options.chat, record=True)


def record(options: DecodeOptions, prompt: str, machine: str):
    before = machine_load.snapshot()
    trace = generate(options, prompt)  # the API loads (and keeps) the models as the CLI does: int8 draft where "auto"
    trace.totals["recorded"] = {"machine": machine, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                                "load": machine_load.between(before, machine_load.snapshot()),
                                "with": "bench/record_opening.py: the baseline, then the opening run, one process"}
    return trace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", default=str(OPENING_PATH.parent))
    args = parser.parse_args()
    opening, prompt = OPENING_OPTIONS.validate(), OPENING_PROMPT
    baseline = baseline_of(opening)
    machine = machine_description(torch.device("cpu"))
    for options in (baseline, opening):  # loads, first-call overheads and lazy set-up, as the Race's warm-up
        generate(replace(options, max_new_tokens=WARMUP_TOKENS), prompt)
    traces = {BASELINE_PATH.name: record(baseline, prompt, machine),
              OPENING_PATH.name: record(opening, prompt, machine)}
    for name, trace in traces.items():
        path = Path(args.out_dir) / name
        path.write_text(trace.to_json(indent=1), encoding="utf-8")
        load = trace.totals["recorded"]["load"]
        print(f"{name}: {trace.totals['tokens_per_second']:.2f} tokens/s, tau {trace.totals['tau']:.2f}, "
              f"{len(trace.output_ids)} tokens; {machine_load.load_words(load)} -> {path}", flush=True)


if __name__ == "__main__":
    main()
