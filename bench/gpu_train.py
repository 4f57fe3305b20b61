"""Train SmolLM2's EAGLE head on a lent GPU first, then race it (issue 45.2): the first part of the GPU call.

    python -m bench.gpu_train --minutes 4     # on a lent GPU, before `python -m bench.gpu --eagle-head DIR`
    python -m bench.gpu_train --dry-run       # the same three commands on this CPU with tiny sizes

On a 2-core CPU an hour buys ~0.2M tokens of the target's own replies and ~25 minutes of head training; a GPU
writes that many in seconds. The same resumable commands the CPU runs use, with --device cuda and a time share each:
  replies  the target answers ShareGPT / code prompts (decoders/training/prompts.py), batched 64 rows, its features
           recorded (`python -m decoders.training replies`); the held-out prompts are the CPU runs' own, so the
           comparison below is the one bench/results/drafter-eagle-*-heldout.md made
  train    the EAGLE head continues from the shipped one (`python -m decoders.eagle train --init assets/eagle/...`)
  compare  the ship rule on the held-out replies (`python -m decoders.training compare`, α only: the race that
           follows measures speed)
The trained head lands in DIR (default /tmp/speclab-train/head); `python -m bench.gpu --eagle-head DIR` races it
beside the shipped one. Weights, the comparison and the logs are copied into $OUT when it is set (the device tool
brings $OUT back): copy the head into assets/eagle/<target> only if the comparison says it beats the shipped one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TARGET = "smollm2-135m"
# minutes: the call's share for each step (the model loads and the features are outside the training minutes)
GPU = dict(device="cuda", batch=64, reply_share=0.35, train_share=0.45, batch_tokens=16384, eval_every=1.0,
           train_tokens=5_000_000, max_steps=0, decode_prompts=0, reply_args=())
DRY = dict(device="cpu", batch=4, reply_share=0.0, train_share=0.0, batch_tokens=256, eval_every=100.0,
           train_tokens=200, max_steps=2, decode_prompts=0,
           reply_args=("--heldout-chat", "2", "--heldout-code", "1", "--max-new", "12"))  # a few held-out prompts


def commands(work: Path, minutes: float, settings: dict, prompts: str | None = None,
             target: str = TARGET) -> dict[str, list[str]]:
    """The three commands, in order (each resumable: a second call continues the folder and the checkpoint)."""
    py = [sys.executable, "-m"]
    prompt_file = ["--prompts", prompts] if prompts else []
    replies, head = work / "replies", work / "head"
    reply_minutes = ["--max-minutes", f"{minutes * settings['reply_share']:.2f}"] if settings["reply_share"] else []
    train_budget = (["--max-steps", str(settings["max_steps"])] if settings["max_steps"]
                    else ["--max-minutes", f"{minutes * settings['train_share']:.2f}"])
    return {
        "replies": py + ["decoders.training", "replies", "--target", target, "--out", str(replies), "--device",
                         settings["device"], "--batch", str(settings["batch"]), "--train-tokens",
                         str(settings["train_tokens"]), *reply_minutes, *settings["reply_args"], *prompt_file],
        "train": py + ["decoders.eagle", "train", "--target", target, "--replies", str(replies), "--init",
                       str(ROOT / "assets" / "eagle" / target), "--device", settings["device"], "--batch-tokens",
                       str(settings["batch_tokens"]), "--lr", "3e-4", "--eval-every", str(settings["eval_every"]),
                       "--save-dtype", "float16", "--checkpoint", str(work / "ckpt.pt"), *train_budget,
                       "--out", str(head)],
        "compare": py + ["decoders.training", "compare", "--kind", "eagle", "--target", target, "--replies",
                         str(replies), "--candidate", str(head), "--device", settings["device"],
                         "--decode-prompts", str(settings["decode_prompts"]), "--out",
                         str(work / f"drafter-eagle-{target}-heldout-gpu")],
    }


def run(work: Path, minutes: float, settings: dict, prompts: str | None = None) -> dict:
    """Each command in turn, its output to work/<name>.log; a failed one stops the rest (they need its output)."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    steps = {}
    for name, command in commands(work, minutes, settings, prompts).items():
        began = time.monotonic()
        print(f"== {name}: {' '.join(command[2:])}", flush=True)
        with open(work / f"{name}.log", "w", encoding="utf-8") as log:
            code = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        steps[name] = {"command": "python " + " ".join(command[1:]), "returncode": code,
                       "seconds": round(time.monotonic() - began, 1), "log_tail": _tail(work / f"{name}.log")}
        print(f"   {name}: exit {code} in {steps[name]['seconds']} s", flush=True)
        if code != 0:
            break
    verdict = work / f"drafter-eagle-{TARGET}-heldout-gpu.json"
    result = {"device": torch.cuda.get_device_name(0) if settings["device"] == "cuda" else "cpu (dry run)",
              "minutes": minutes, "steps": steps, "head": str(work / "head")}
    if verdict.is_file():
        record = json.loads(verdict.read_text(encoding="utf-8"))
        result.update(verdict=record["verdict"], wins=record["wins"])
    (work / "gpu-train.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def bring_back(work: Path, out: str | None) -> None:
    """The head, the comparison and the logs under $OUT (the device tool's way home); nothing without $OUT."""
    if not out:
        return
    home = Path(out) / "gpu-train"
    home.mkdir(parents=True, exist_ok=True)
    for item in work.iterdir():
        if item.name == "head":
            shutil.copytree(item, home / "head", dirs_exist_ok=True)
        elif item.suffix in (".json", ".md", ".log"):
            shutil.copy(item, home / item.name)


def _tail(path: Path, lines: int = 3) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r", "\n")
    return [line for line in text.splitlines() if line.strip()][-lines:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_train", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same commands on the CPU, tiny sizes")
    parser.add_argument("--minutes", type=float, default=4.0, help="the call's share for replies + training")
    parser.add_argument("--work", default="/tmp/speclab-train", help="replies, checkpoint and head go here")
    parser.add_argument("--prompts", default=None, help="the prompt file bench/gpu_ship.py prepare wrote (a lent GPU "
                        "has no ShareGPT package); default: the datasets installed here")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device here: `python -m bench.gpu_train --dry-run` tries the commands on the CPU", file=sys.stderr)
        return 2
    result = run(Path(args.work), args.minutes, DRY if args.dry_run else GPU, args.prompts)
    bring_back(Path(args.work), os.environ.get("OUT"))
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    return 0 if all(step["returncode"] == 0 for step in result["steps"].values()) and len(result["steps"]) == 3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
