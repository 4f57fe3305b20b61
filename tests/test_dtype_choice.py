"""dtype="auto" (decoders/dtype_choice.py): decided by declared hardware features, the same in every process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from decoders import dtype_choice, models
from decoders.dtype_choice import CpuFeatures, decide_cuda, decide_from_flags, decide_from_probe

ROOT = Path(__file__).resolve().parents[1]
AVX2_FLAGS = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c".split())


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty SpecLab cache and no per-process memo of earlier decisions."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dtype_choice, "_DECIDED", {})
    return tmp_path / "cache"


# ---------------------------------------------------------------- the rules, with faked hardware

def test_avx2_only_cpu_gets_float32():
    decision = decide_from_flags(CpuFeatures("AMD EPYC", AVX2_FLAGS, "AVX2", True))
    assert decision.dtype == torch.float32 and "no native bf16" in decision.why


def test_avx512_without_bf16_gets_float32():
    decision = decide_from_flags(CpuFeatures("Xeon", AVX2_FLAGS | {"avx512f", "avx512bw"}, "AVX512", True))
    assert decision.dtype == torch.float32 and "AVX-512" in decision.why


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_native_bf16_flag_gets_bfloat16(flag):
    decision = decide_from_flags(CpuFeatures("Xeon", AVX2_FLAGS | {"avx512f", flag}, "AVX512", True))
    assert decision.dtype == torch.bfloat16 and flag in decision.why


@pytest.mark.parametrize("features", [CpuFeatures("?", frozenset(), "DEFAULT", True),  # flags unreadable
                                      CpuFeatures("Xeon", AVX2_FLAGS | {"avx512_bf16"}, "AVX2", True),  # torch: AVX2
                                      CpuFeatures("Neoverse", frozenset({"fp", "asimd", "bf16"}), "DEFAULT", True)])
def test_ambiguous_flags_leave_it_to_the_probe(features):
    assert decide_from_flags(features) is None


@pytest.mark.parametrize("capability, dtype", [((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16),
                                               ((7, 5), torch.float16), ((7, 0), torch.float16)])
def test_cuda_capability(capability, dtype):
    decision = decide_cuda(capability, "Some GPU")
    assert decision.dtype == dtype and f"{capability[0]}.{capability[1]}" in decision.why


def test_probe_needs_a_wide_margin():
    float32 = {1: 1.0, 8: 3.0}
    assert decide_from_probe(float32, {1: 0.9, 8: 2.2}, "ambiguous").dtype == torch.float32  # 1.36x: noise range
    assert decide_from_probe(float32, {1: 0.9, 8: 1.9}, "ambiguous").dtype == torch.bfloat16  # 1.58x
    assert decide_from_probe(float32, {1: 1.3, 8: 1.0}, "ambiguous").dtype == torch.float32  # loses one-row steps


def test_cpuinfo_is_parsed(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 amx_bf16\n\n"
                       "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 amx_bf16\n")
    features = dtype_choice.read_cpu_features(cpuinfo)
    assert features.model_name == "Test CPU 9000" and features.flags == {"fpu", "avx2", "amx_bf16"}
    assert dtype_choice.read_cpu_features(tmp_path / "missing").flags == frozenset()


# ---------------------------------------------------------------- the cache

def test_ambiguous_decision_is_recorded_and_reused(fresh, monkeypatch):
    """A noisy probe decides once per machine; later processes (here: a cleared memo) read the record."""
    ambiguous = CpuFeatures("Mystery CPU", frozenset(), "DEFAULT", True)
    monkeypatch.setattr(dtype_choice, "read_cpu_features", lambda: ambiguous)
    results = iter([({1: 1.0, 8: 4.0}, {1: 0.5, 8: 1.0}),   # bf16 wins clearly
                    ({1: 1.0, 8: 1.0}, {1: 5.0, 8: 5.0})])  # would say float32 if it were asked
    monkeypatch.setattr(dtype_choice, "_probe", lambda: next(results))
    first = dtype_choice.dtype_decision(torch.device("cpu"))
    assert first.dtype == torch.bfloat16 and "probe" in first.why
    monkeypatch.setattr(dtype_choice, "_DECIDED", {})
    assert dtype_choice.dtype_decision(torch.device("cpu")) == first  # the second probe result was never asked for
    record = json.loads((fresh / dtype_choice.CACHE_NAME).read_text())
    assert record[dtype_choice.fingerprint(ambiguous)]["dtype"] == "bfloat16"


def test_models_dtype_decision_is_what_auto_resolves_to(fresh):
    decision = models.dtype_decision("cpu")
    assert models.resolve_dtype("auto", "cpu") is decision.dtype and decision.why


# ---------------------------------------------------------------- this machine, many processes

def expected_for_this_machine() -> torch.dtype:
    """Written out from /proc/cpuinfo independently of the module's rules (its parser included)."""
    text = Path("/proc/cpuinfo").read_text()
    flags = set(next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    native = bool(flags & {"avx512_bf16", "amx_bf16"}) and torch.backends.cpu.get_cpu_capability() == "AVX512"
    return torch.bfloat16 if native else torch.float32


DECIDE = "from decoders import models; d = models.dtype_decision('cpu'); print(d.name + '|' + d.why)"


def decide_in_fresh_process(cache: Path) -> str:
    env = {**os.environ, "SPECLAB_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", DECIDE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow  # 40 interpreters, two at a time: about a minute
@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="needs Linux CPU flags")
def test_twenty_fresh_processes_decide_the_same(tmp_path):
    caches = [tmp_path / f"empty-{i}" for i in range(20)] + [tmp_path / "shared"] * 20
    with ThreadPoolExecutor(max_workers=2) as pool:  # a 2-core machine: two interpreters at a time
        answers = list(pool.map(decide_in_fresh_process, caches))
    assert len(set(answers)) == 1, answers
    assert answers[0].split("|")[0] == str(expected_for_this_machine()).removeprefix("torch.")
