"""The memory budget on a CPU Space: a 16 GB container on a bigger host. The budget follows the container's limit
(not the host's RAM that /proc/meminfo reports there), and the visitor sequence that held 12.5-13.2 GB with nothing
evicted under a 24 GB machine's budget (the Qwen pair, the cross-tokenizer draft, SmolLM2 in two precisions) stays
inside 60% of 16 GiB (10.3 GB of models, beside the ~3.7 GB the app itself held then), and one more model (the
target in bfloat16) evicts the least recently used instead of growing past the container."""
from __future__ import annotations

import pytest
import torch

from decoders.runtime import models, residency
from test_memory_budget import fake_loader, random_lm  # noqa: F401  (fixture)

GIB = 1 << 30
CPU = torch.device("cpu")
# Each model's size in float32 (parameters x 4 bytes; bf16 half that), as the registry's models load
SIZES = {"qwen2.5-coder-1.5b": 6.17e9, "qwen2.5-coder-1.5b@bf16": 3.09e9, "qwen2.5-coder-0.5b": 1.98e9,
         "smollm2-135m": 0.54e9, "smollm2-135m@bf16": 0.27e9}


@pytest.fixture
def a_16_gb_container(tmp_path, monkeypatch):
    limit = tmp_path / "memory.max"
    limit.write_text(f"{16 * GIB}\n")
    monkeypatch.setattr(residency, "CGROUP_LIMITS", (str(limit),))
    monkeypatch.setattr(residency, "_meminfo_bytes", lambda: 64 * GIB)  # the host's RAM, as a Space reports it
    monkeypatch.delenv(residency.ENV_BUDGET, raising=False)
    return limit


def test_the_budget_follows_the_container_limit(a_16_gb_container):
    assert residency.total_memory_bytes(CPU) == 16 * GIB
    assert residency.memory_budget_bytes(CPU) == int(16 * GIB * residency.CPU_SHARE)


@pytest.mark.parametrize("text", ["max\n", f"{(1 << 63) - 4096}\n", "garbage\n"])
def test_no_limit_means_the_machine_ram(a_16_gb_container, text):
    a_16_gb_container.write_text(text)
    assert residency.total_memory_bytes(CPU) == 64 * GIB


def test_the_visitor_sequence_evicts_inside_a_16_gb_container(a_16_gb_container, fake_loader, monkeypatch):
    sizes = {}  # id(model) -> the real model's size

    def sized_load(name, dtype, device, say):
        loaded = random_lm(name)
        sizes[id(loaded.model)] = int(SIZES[name + ("@bf16" if dtype == torch.bfloat16 else "")])
        return loaded

    monkeypatch.setattr(models, "_load", sized_load)
    monkeypatch.setattr(models, "model_bytes", lambda model: sizes[id(model)])
    budget = residency.memory_budget_bytes(CPU)
    messages = []
    for name, dtype in (("qwen2.5-coder-1.5b", "float32"), ("qwen2.5-coder-0.5b", "float32"),
                        ("smollm2-135m", "float32"), ("smollm2-135m", "bfloat16")):
        models.load_model(name, dtype=dtype, device="cpu", progress=messages.append)
        assert sum(row["gb"] for row in models.resident_models()) * 1e9 <= budget + 1e7
    assert not any(m.startswith("unloading") for m in messages)  # 8.96 GB: fits
    models.load_model("qwen2.5-coder-1.5b", dtype="bfloat16", device="cpu", progress=messages.append)
    sizes_now = sum(row["gb"] for row in models.resident_models()) * 1e9
    assert sizes_now <= budget + 1e7
    assert any(m.startswith("unloading qwen2.5-coder-1.5b") for m in messages), messages  # the least recent
