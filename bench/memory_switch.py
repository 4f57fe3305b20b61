"""Memory after switching models under a small budget: `python -m bench.memory_switch [--budget-gb 1.2]`.

Issue 10 #2's closing figure. One process loads SmolLM2-135M and Gemma-3-270M in float32 and bfloat16 (the Qwen
models are left out: minutes of CPU and 3-7 GB each), one after another, with $SPECLAB_MEMORY_BUDGET_GB set small
so that later loads must evict earlier ones. After each switch it prints the process's resident set (VmRSS, what
the operating system really gives the process) beside decoders.runtime.models.resident_models() (what the budget counts),
and the status lines the loader said. Output: a Markdown table on stdout, or written to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SWITCHES = (("smollm2-135m", "float32"), ("smollm2-135m", "bfloat16"), ("gemma3-270m", "float32"),
            ("gemma3-270m", "bfloat16"), ("smollm2-135m", "float32"))  # the last one comes back after eviction


def rss_gb() -> float:
    """This process's resident set from /proc/self/status (Linux), in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e9  # kB
    raise RuntimeError("no VmRSS in /proc/self/status: this measurement needs Linux")


def resident_text(residents: list[dict]) -> str:
    return ", ".join(f"{r['name']} {r['dtype']} {r['gb']:.3g} GB" for r in residents) or "(none)"


def switch_through(switches=SWITCHES) -> list[dict]:
    """Load each (model, dtype) in turn; one row per step with RSS, the resident set and what the loader said."""
    from decoders.runtime import models

    rows = [{"step": "start (torch and transformers imported)", "rss_gb": rss_gb(), "resident": "(none)",
             "said": "", "seconds": 0.0}]
    for name, dtype in switches:
        said: list[str] = []
        start = time.perf_counter()
        models.load_model(name, dtype=dtype, device="cpu", progress=said.append)
        models.release_memory()  # what the app's eviction does too; here also after a load that evicted nothing
        rows.append({"step": f"load {name} {dtype}", "rss_gb": rss_gb(), "seconds": time.perf_counter() - start,
                     "resident": resident_text(models.resident_models()),
                     "said": " / ".join(s for s in said if "unload" in s or "again" in s or "budget" in s)})
    models.unload_all()
    rows.append({"step": "unload_all()", "rss_gb": rss_gb(), "resident": resident_text(models.resident_models()),
                 "said": "", "seconds": 0.0})
    return rows


def markdown(rows: list[dict], budget_gb: float) -> str:
    lines = [f"# Memory after switching models (budget {budget_gb:g} GB, one process, CPU)", "",
             f"`python -m bench.memory_switch --budget-gb {budget_gb:g}` · torch threads: 1 · "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "RSS is the whole process (Python, torch, tokenizers included); 'resident' is what "
             "decoders.runtime.models.resident_models() counts against the budget (parameters and buffers).", "",
             "| step | RSS (GB) | resident models | load (s) | the loader said |", "|---|---:|---|---:|---|"]
    lines += [f"| {r['step']} | {r['rss_gb']:.2f} | {r['resident']} | {r['seconds']:.1f} | {r['said']} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gb", type=float, default=1.2,
                        help="memory budget for resident models (sets SPECLAB_MEMORY_BUDGET_GB); default 1.2")
    parser.add_argument("--out", type=Path, help="write the Markdown table here as well")
    args = parser.parse_args(argv)
    if not args.budget_gb > 0:
        parser.error("--budget-gb must be a positive number of gigabytes, e.g. 1.2")
    os.environ["SPECLAB_MEMORY_BUDGET_GB"] = str(args.budget_gb)  # before decoders reads it
    import torch

    torch.set_num_threads(1)
    text = markdown(switch_through(), args.budget_gb)
    sys.stdout.write(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
