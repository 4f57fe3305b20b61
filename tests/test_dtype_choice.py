"""dtype="auto" is float32 on every machine (decoders/runtime/dtype_choice.py): the format that keeps the promise.

The decision is tested with faked features for both kinds of CPU the project runs on (AVX2-only, and one that
declares native bf16 matmul) and for GPUs; the end-to-end promise (speculative equals the baseline under the default
dtype) is tested in tests/test_real_models.py on SmolLM2 with the same fakes.
"""
from __future__ import annotations

import pytest
import torch

from decoders.runtime import dtype_choice, models
from decoders.runtime.dtype_choice import ROUNDING_NOTE, CpuFeatures, decide_cpu, decide_cuda

AVX2_FLAGS = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c".split())
AVX2_CPU = CpuFeatures("AMD EPYC (AVX2 only)", AVX2_FLAGS, "AVX2", True)
BF16_CPU = CpuFeatures("AMD EPYC (avx512_bf16)", AVX2_FLAGS | {"avx512f", "avx512bw", "avx512_bf16"}, "AVX512", True)
AMX_CPU = CpuFeatures("Xeon (amx)", AVX2_FLAGS | {"avx512f", "amx_bf16"}, "AVX512", True)
NO_FLAGS = CpuFeatures("unknown CPU", frozenset(), "DEFAULT", True)


@pytest.mark.parametrize("cpu", [AVX2_CPU, BF16_CPU, AMX_CPU, NO_FLAGS], ids=["avx2", "avx512_bf16", "amx", "none"])
def test_every_cpu_gets_float32(cpu):
    decision = decide_cpu(cpu)
    assert decision.dtype == torch.float32 and "equal to the baseline" in decision.why


def test_a_native_bf16_flag_is_named_but_not_read_as_a_speed_claim():
    why = decide_cpu(BF16_CPU).why
    assert "avx512_bf16" in why and "not a measured speed-up" in why and ROUNDING_NOTE in why
    assert "no native bf16" in decide_cpu(AVX2_CPU).why


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (9, 0)])
def test_every_gpu_gets_float32(capability):
    decision = decide_cuda(capability, "Some GPU")
    assert decision.dtype == torch.float32 and f"{capability[0]}.{capability[1]}" in decision.why


@pytest.mark.parametrize("cpu", [AVX2_CPU, BF16_CPU], ids=["avx2", "avx512_bf16"])
def test_auto_resolves_to_float32_through_the_loader(monkeypatch, cpu):
    """What load_model(dtype="auto") uses, with this machine's CPU replaced by each kind."""
    monkeypatch.setattr(dtype_choice, "read_cpu_features", lambda: cpu)
    assert models.resolve_dtype("auto", "cpu") is torch.float32
    assert models.dtype_decision("cpu").why == decide_cpu(cpu).why


def test_explicit_formats_stay_available():
    assert models.resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    assert models.resolve_dtype("float16", "cpu") is torch.float16


def test_cpuinfo_is_parsed(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 amx_bf16\n\n"
                       "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 amx_bf16\n")
    features = dtype_choice.read_cpu_features(cpuinfo)
    assert features.model_name == "Test CPU 9000" and features.flags == {"fpu", "avx2", "amx_bf16"}
    assert dtype_choice.read_cpu_features(tmp_path / "missing").flags == frozenset()
