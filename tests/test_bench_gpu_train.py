"""bench/gpu_train.py: on a lent GPU the EAGLE head trains first, then bench.gpu races it (issue 45.2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_arms, gpu_ship, gpu_train
from decoders.training.prompts import Prompt, read_prompt_file, write_prompt_file


def test_the_three_commands_chain_replies_training_and_the_ship_rule(tmp_path):
    cmds = gpu_train.commands(tmp_path, 3.0, gpu_train.GPU, prompts="p.jsonl")
    assert list(cmds) == ["replies", "train", "compare"]
    replies, train, compare = (" ".join(c) for c in cmds.values())
    assert "--device cuda" in replies and "--prompts p.jsonl" in replies and "--max-minutes 1.05" in replies
    assert f"--replies {tmp_path / 'replies'}" in train and "--init" in train and "--max-minutes 1.35" in train
    assert f"--candidate {tmp_path / 'head'}" in compare and "--kind eagle" in compare
    assert "assets/eagle/smollm2-135m" in train  # it continues the shipped head, not a fresh one


def test_a_prompt_file_carries_the_split_and_the_order(tmp_path):
    train = [Prompt(f"t{i}", "train", ({"role": "user", "content": f"write {i} ü"},)) for i in range(5)]
    held = [Prompt("h0", "heldout", ({"role": "user", "content": "held"},))]
    assert write_prompt_file(tmp_path / "p.jsonl", train, held, max_train=3) == 4
    again_train, again_held = read_prompt_file(tmp_path / "p.jsonl")
    assert again_train == train[:3] and again_held == held


def test_the_gpu_call_trains_before_it_races_the_trained_head():
    command = gpu_ship.run_command("ab" * 32)
    assert command.index("bench.gpu_train") < command.index("python3 -m bench.gpu --")
    assert "--eagle-head /tmp/speclab-train/head" in command and "--prompts .gpu-ship/wheels/prompts.jsonl" in command
    keys = [m.key for m in gpu_arms.speculative_arms(True, "/tmp/speclab-train/head")]
    assert "ours/eagle2-cost-retrained" in keys and "ours/eagle2-cost-retrained" not in [
        m.key for m in gpu_arms.speculative_arms(True)]


@pytest.mark.slow
def test_the_dry_run_trains_a_head_and_brings_it_back(tmp_path, monkeypatch):
    """The same three commands on the CPU with tiny sizes: a head is written, compared, and copied under $OUT."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    assert gpu_train.main(["--dry-run", "--work", str(tmp_path / "work")]) == 0
    result = json.loads((tmp_path / "work" / "gpu-train.json").read_text())
    assert [s["returncode"] for s in result["steps"].values()] == [0, 0, 0]
    assert "verdict" in result and isinstance(result["wins"], bool)
    home = Path(out) / "gpu-train"
    assert (home / "head" / "model.safetensors").is_file() and (home / "gpu-train.json").is_file()
    assert (home / "train.log").read_text().strip()
