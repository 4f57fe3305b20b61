"""Record the run the page opens on and the baseline beside it, so the first page shows what "faster" means.

    flock /tmp/speclab-heavy.lock .venv/bin/python -m bench.record_opening

Both come from one process on the same loaded models, one right after the other: an 8-token warm-up of each, then the
baseline, then the opening method (assets/traces/eagle2-qwen-code.json keeps its options; the baseline gets the same
model, prompt, dtype, chat template and token budget). Each trace keeps totals["recorded"]: the machine, the date and
the load measured while it ran (app/tabs/race/load.py), which the Generate tab's opening line quotes beside both speeds.
"""
from __future__ import annotations

import argparse
import datetime
from dataclasses import replace
from pathlib import Path

import torch

from app.tabs.generate.controls import OPENING_PATH, recorded_options, recorded_prompt
from app.tabs.race import load as machine_load
from decoders import DecodeOptions, generate
from decoders.costs import machine_description

BASELINE_PATH = OPENING_PATH.with_name("baseline-qwen-code.json")
WARMUP_TOKENS = 8


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
    opening = replace(recorded_options(OPENING_PATH), record=True)
    prompt = recorded_prompt(OPENING_PATH)
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
