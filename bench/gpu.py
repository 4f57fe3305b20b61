"""The GPU checks and the GPU benchmark in one command (issue 32, part 4).

    python -m bench.gpu              # on a lent GPU: the CUDA checks, then the benchmark (under 8 minutes)
    python -m bench.gpu --dry-run    # the same pipeline on this CPU, tiny settings (a couple of minutes)

Stages, each timed and written to the results as it ends (a later failure or the call's time limit keeps them):
  environment  the device, PyTorch, transformers, the commit
  checks       (last, in the time left) pytest over tests/test_graphs.py, tests/test_buffers.py and tests/test_cuda.py with every tiny model on
               the GPU (SPECLAB_TEST_DEVICE=cuda): graph replays equal eager forwards, every method equals the
               baseline with graphs, static buffers equal the DynamicCache there too. The dry run runs the CPU
               checks of tests/test_graphs.py only.
  steps        SmolLM2-135M float32, t(n) = one forward of n tokens / one of 1 token after a 128-token context, for
               n = 1..128, as the DynamicCache, fixed buffers and CUDA graphs run it (t(64)/t(1) is the issue's
               flatness target), and the graphed tree-mask curve
  race         on code prompts (assets/bench: HumanEval), every method interleaved and paired by prompt and
               repetition (bench/runner.py): the baseline three ways (graphs, fixed eager, DynamicCache eager),
               the speculative methods with graphs against the graph baseline (prompt lookup ± the cost-aware
               controller, EAGLE-2 with the shipped head ± controller, DDD, early exit, prophet), transformers'
               greedy, prompt lookup and assistant early exit; every output compared with the graph baseline's
  hf-static    transformers' generate with its own static cache (compiled by transformers itself on CUDA, and
               not compiled), each output compared with the baseline; an error is recorded as the result
Writes bench/results/gpu-<device>.{md,json} and gpu-<device>-pytest.log (the dry run: gpu-dry-run.*), and copies
them into $OUT when that is set (the device tool brings $OUT back). bench/README.md ("On a lent GPU") says how
the weights and wheels travel (bench/gpu_ship.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from decoders.runtime import kernels

from . import gpu_arms, gpu_report
from .__main__ import load_prompts
from .runner import mark_identity, run_one, run_suite

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TARGET = "smollm2-135m"
CHECKS_GPU = ["tests/test_graphs.py", "tests/test_buffers.py", "tests/test_cuda.py"]
CHECKS_DRY = ["tests/test_graphs.py", "-k", "bucket or mask or padded or readout"]
# deadline: seconds from the start by which the checks must end (the device command runs under `timeout 570`)
FULL = dict(per_kind=2, reps=2, max_new_tokens=64, tn_repeats=5, deadline=540)
DRY = dict(per_kind=1, reps=1, max_new_tokens=8, tn_repeats=1, deadline=3600)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same pipeline on the CPU, tiny settings")
    parser.add_argument("--skip-checks", action="store_true", help="leave the pytest stage out")
    parser.add_argument("--per-kind", type=int, default=None, help="code prompts per kind (writing, editing)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--out", default=None, help="output stem (default bench/results/gpu-<device>)")
    parser.add_argument("--arms", default=None, help="race only these arms (comma-separated keys; the graph "
                        "baseline always runs): a short follow-up on a lent GPU")
    parser.add_argument("--deadline", type=int, default=None, help="seconds from the start by which the checks "
                        "must end (default 540: the call's 570 s limit; less when bench.gpu_train ran first)")
    parser.add_argument("--eagle-head", default=None, help="also race EAGLE-2 from this head folder (the one "
                        "`python -m bench.gpu_train` trained on this GPU just before)")
    parser.add_argument("--skip", default="", help="stages to leave out, comma-separated (steps, race, hf-static)")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available() and not args.dry_run
    if not on_gpu and not args.dry_run:
        print("no CUDA device here: run `python -m bench.gpu --dry-run` to try the pipeline on the CPU", file=sys.stderr)
        return 2
    settings = {**(DRY if args.dry_run else FULL),
                **{k: v for k, v in vars(args).items() if k in ("per_kind", "reps", "max_new_tokens", "deadline") and v}}
    stem = Path(args.out) if args.out else RESULTS / f"gpu-{device_slug(on_gpu)}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    result = {"meta": environment(on_gpu, settings, argv), "stages": {}}
    began = time.monotonic()
    models = {}

    def save_stage(name: str, so_far: dict) -> None:
        result["stages"][name] = so_far
        write(stem, result, began)

    stages = [("load", lambda: load_target(models, on_gpu)),
              ("steps", lambda: measure_steps(models["target"].model, settings["tn_repeats"])),
              ("race", lambda: race(models, on_gpu, settings, save=lambda so_far: save_stage("race", so_far))),
              ("hf-static", lambda: hf_static(models["target"], result, settings))]
    settings["arms"] = args.arms.split(",") if args.arms else None
    settings["retrained_head"] = args.eagle_head
    skipped = set(filter(None, args.skip.split(",")))
    for name, work in stages:  # the figures first: the checks get the time that is left (a call has 10 minutes)
        if name not in skipped and (name == "load" or models):
            stage(result, name, work)
            write(stem, result, began)  # after every stage: a run stopped at its time limit keeps what it measured
    if not args.skip_checks:
        left = int(settings["deadline"] - (time.monotonic() - began))
        stage(result, "checks", lambda: run_checks(on_gpu, stem, max(60, left)))
    write(stem, result, began)
    print(gpu_report.markdown(result))
    return 0 if all("error" not in s for s in result["stages"].values()) else 1


def device_slug(on_gpu: bool) -> str:
    """"h100", "h200", ... from the GPU's name; "dry-run" on the CPU."""
    if not on_gpu:
        return "dry-run"
    name = torch.cuda.get_device_name(0).lower()
    return next((part for part in name.replace("nvidia", "").split() if any(c.isdigit() for c in part)), "gpu")


def environment(on_gpu: bool, settings: dict, argv) -> dict:
    import transformers

    shipped = ROOT / "bench" / "gpu-commit.txt"  # bench/gpu_ship.py writes it: the device's .git is not ours
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if shipped.exists():
        commit.stdout = shipped.read_text().strip()
    return {"command": " ".join(["python -m bench.gpu", *(argv if argv is not None else sys.argv[1:])]),
            "device": torch.cuda.get_device_name(0) if on_gpu else f"CPU ({platform.processor() or platform.machine()})",
            "dry_run": not on_gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "commit": commit.stdout.strip() or "unknown", "date": time.strftime("%Y-%m-%d %H:%M"),
            "target": TARGET, "dtype": "float32", "settings": settings}


def stage(result: dict, name: str, work) -> None:
    """Run one stage; its figures, or its error, go into result["stages"][name] with its seconds."""
    start = time.monotonic()
    print(f"== {name}", flush=True)
    try:
        out = work() or {}
    except Exception as err:  # a failed stage is a result: the later stages still run
        out = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-2000:]}
        print(out["traceback"], file=sys.stderr)
    out["seconds"] = time.monotonic() - start
    result["stages"][name] = out


def run_checks(on_gpu: bool, stem: Path, timeout: int) -> dict:
    args = CHECKS_GPU if on_gpu else CHECKS_DRY
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **({"SPECLAB_TEST_DEVICE": "cuda"} if on_gpu else {})}
    workers = ["-n", "4"] if on_gpu and importlib.util.find_spec("xdist") else []  # the image has pytest-xdist
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *args]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        log, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        log, code = f"{err.stdout or ''}{err.stderr or ''}\n(stopped after {timeout} s)", None
    log = log.decode() if isinstance(log, bytes) else log
    Path(f"{stem}-pytest.log").write_text(log, encoding="utf-8")
    summary = [line for line in log.splitlines() if " passed" in line or " failed" in line or "error" in line][-3:]
    return {"command": " ".join(command[1:]), "returncode": code, "summary": summary,
            "log": f"{stem.name}-pytest.log"}


def load_target(models: dict, on_gpu: bool) -> dict:
    from decoders.runtime.models import load_model

    models["target"] = load_model(TARGET, dtype="float32", device="cuda" if on_gpu else "cpu")
    return {"device": str(models["target"].device)}


def measure_steps(model, repeats: int) -> dict:
    widths = gpu_arms.TN_WIDTHS if model.device.type == "cuda" else (1, 2, 4, 8)
    paths = ("dynamic", "fixed", "graphs") if model.device.type == "cuda" else ("dynamic", "fixed")
    curves = {path: gpu_arms.time_widths(model, path, widths, repeats) for path in paths}
    if "graphs" in paths:
        curves["graphs-tree"] = gpu_arms.time_widths(model, "graphs", widths, repeats, tree=True)
        fused = kernels.kernels_of(model)
        if fused == kernels.PACKED:  # the same graphs on transformers' own modules: what fusing the norms buys
            try:
                kernels.use(model, kernels.STOCK)
                curves["graphs-stock"] = gpu_arms.time_widths(model, "graphs", widths, repeats)
            finally:
                kernels.use(model, fused)
    return {"widths": list(widths), "curves": curves, "kernels": kernels.kernels_of(model)}


def race(models: dict, on_gpu: bool, settings: dict, save=None) -> dict:
    """Every arm on the code prompts. An arm whose warm-up raises is left out with its error (one broken path must
    not cost the others' figures on a one-shot GPU loan); `save` gets the stage so far after every run (a call
    stopped at its time limit keeps what it measured)."""
    methods = (gpu_arms.step_arms(on_gpu) + gpu_arms.speculative_arms(on_gpu, settings.get("retrained_head"))
               + gpu_arms.hf_arms())
    if settings.get("arms"):
        methods = [m for m in methods if m.key in settings["arms"] or m.key == gpu_report.GRAPH_BASELINE]
    prompts = load_prompts(settings["per_kind"], ["code-writing", "code-editing"])
    for prompt in prompts:
        prompt.ids = prompt.ids or models["target"].encode_prompt(prompt.text, chat=True)
    failed = {}
    for method in methods:  # the warm-up, one per arm: first calls capture the graphs and pay one-off costs
        try:
            run_one(method, models, prompts[0], min(4, settings["max_new_tokens"]))
        except Exception as err:
            failed[method.key] = f"{type(err).__name__}: {err}"[:300]
            print(f"  {method.key} left out: {failed[method.key]}", file=sys.stderr)
    methods = [m for m in methods if m.key not in failed]

    def summary(records: list[dict]) -> dict:
        return {"methods": [{"key": m.key, "label": m.label, "options": m.options} for m in methods],
                "failed_arms": failed, "prompts": [p.id for p in prompts], "records": [_slim(r) for r in records],
                "caps": {m.key: gpu_arms.caps(records, m.key) for m in methods
                         if m.options.get("controller") == "cost"}}

    def keep(records: list[dict]) -> None:
        if save is not None:
            mark_identity(records)  # idempotent: run_suite marks the full list again at its end
            save({**summary(records), "partial": f"{len(records)} runs so far"})

    records = run_suite(methods, models, prompts, settings["reps"], settings["max_new_tokens"], warmup=False,
                        on_record=keep)
    return summary(records)


def hf_static(target, result: dict, settings: dict) -> dict:
    """transformers' static-cache arms on the race's prompts, outputs compared with the graph baseline's."""
    baseline = {r["prompt"]: r["output_ids"] for r in result["stages"].get("race", {}).get("records", [])
                if r["method"] == "ours/baseline"}
    prompts = load_prompts(1, ["code-writing", "code-editing"])  # one per kind: these arms run at eager speed
    runs = []
    for key in gpu_arms.HF_STATIC:
        for prompt in prompts:
            prompt.ids = prompt.ids or target.encode_prompt(prompt.text, chat=True)
            for rep in range(2):  # the first call is the warm-up (and, compiled, the compile); then one timed
                run = gpu_arms.run_hf_static(key, target, prompt.ids, settings["max_new_tokens"])
                run.update(prompt=prompt.id, rep=rep - 1)
                if "output_ids" in run and prompt.id in baseline:
                    run["identical_to_baseline"] = run["output_ids"] == baseline[prompt.id]
                runs.append(run)
                if "error" in run:
                    break
    return {"runs": [{k: v for k, v in r.items() if k != "output_ids"} for r in runs]}


def _slim(record: dict) -> dict:
    """A race record without the per-round lists the report does not read (the JSON stays small)."""
    return {k: v for k, v in record.items() if k not in ("rounds", "phase_seconds", "target_call_sizes")}


def write(stem: Path, result: dict, began: float) -> None:
    result["meta"]["minutes"] = (time.monotonic() - began) / 60
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    Path(f"{stem}.md").write_text(gpu_report.markdown(result), encoding="utf-8")
    out = os.environ.get("OUT")
    if out:  # the device tool brings back what is under $OUT
        for suffix in (".json", ".md", "-pytest.log"):
            if Path(f"{stem}{suffix}").exists():
                shutil.copy(f"{stem}{suffix}", Path(out) / f"{stem.name}{suffix}")


if __name__ == "__main__":
    raise SystemExit(main())
