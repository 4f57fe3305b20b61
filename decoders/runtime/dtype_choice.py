"""What `dtype="auto"` means: float32, on every device, because that is the format that keeps SpecLab's promise.

The promise: a lossless method's greedy output equals the baseline's token for token. The algorithm is exact, but a
verification forward over n tokens sums in another order than n one-token steps, so the two see slightly different
logits. In float32 they differ by ~1e-4 (SmolLM2, packed kernels: at most 8.2e-5 between one 8-token forward and
eight 1-token steps), so the tokens agree unless the top two candidates nearly tie (decoders/compare.py tells such a
rounding flip from a real mismatch). In bfloat16 (8 mantissa bits) they differ by ~0.1, and outputs drift from the
baseline after a few dozen tokens on ordinary prompts.

- CPU: float32, whatever the CPU declares. A native-bf16 flag (avx512_bf16, amx_bf16) says the hardware can
  multiply bf16, not that a one-token step is faster: on one such CPU (2 threads, SmolLM2 / Qwen 0.5B / Qwen 1.5B)
  float32 took 18.1 / 36.9 / 99 ms per one-token step against bfloat16's 24.6 / 52.6 / 151 ms, and bf16 won only
  from 16-token forwards of the 1.5B up (199 vs 178 ms). An earlier rule picked bf16 from that flag: slower and
  inexact.
- CUDA: float32, with TF32 matmuls off (PyTorch's default), so GPU runs keep the promise too. The registry's models
  (up to 1.5B parameters) are launch-bound at batch 1: on an H100, SmolLM2's float32 baseline ran at 0.99x
  transformers' greedy and its bf16 baseline at 0.96x, with no speed gained and equality lost on 2 of 8 prompts.
- bfloat16 and float16 stay available as explicit choices. Whether one is faster on a given machine is measured
  there (decoders/costs.py times t(n) per model and dtype), never inferred from flags; where it is chosen the app
  says "may differ from the baseline by rounding" next to the measured speed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
ROUNDING_NOTE = "may differ from the baseline by rounding"  # the label every faster, inexact format carries


@dataclass(frozen=True)
class DtypeDecision:
    dtype: torch.dtype
    why: str  # one line for people: the app shows it next to the dtype a run used

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class CpuFeatures:
    model_name: str
    flags: frozenset[str]  # empty when the OS does not expose them
    torch_capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    onednn: bool


EXACT_WHY = "float32 keeps greedy output equal to the baseline token for token (up to near-ties)"


def decide_cpu(cpu: CpuFeatures) -> DtypeDecision:
    """float32 on every CPU; the reason names what the CPU declares, so nobody reads the flag as a speed claim."""
    native = sorted(cpu.flags & NATIVE_BF16_FLAGS)
    if native:
        return DtypeDecision(torch.float32, f"{EXACT_WHY}; this CPU declares native bf16 ({', '.join(native)}), "
                                            "which is not a measured speed-up: pick bfloat16 to try it (it "
                                            f"{ROUNDING_NOTE})")
    return DtypeDecision(torch.float32, f"{EXACT_WHY}; this CPU has no native bf16 matmul, so bfloat16 would also "
                                        "be slow here")


def decide_cuda(capability: tuple[int, int], device_name: str = "GPU") -> DtypeDecision:
    major, minor = capability
    return DtypeDecision(torch.float32, f"{EXACT_WHY}; on {device_name} (compute capability {major}.{minor}) these "
                                        "small models are launch-bound, so bfloat16 gains little and it "
                                        f"{ROUNDING_NOTE}")


def read_cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    model_name, flags = "unknown CPU", frozenset()
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "cpu model", "hardware") and model_name == "unknown CPU":
                model_name = value.strip()
            elif key in ("flags", "features") and not flags:  # x86 "flags", ARM "Features"
                flags = frozenset(value.split())
    return CpuFeatures(model_name, flags, torch.backends.cpu.get_cpu_capability(),
                       torch.backends.mkldnn.is_available())


def dtype_decision(device: torch.device) -> DtypeDecision:
    """dtype="auto" for a device, with the one-line reason (the same on every machine: float32)."""
    if device.type == "cuda":
        return decide_cuda(torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return decide_cpu(read_cpu_features())
    return DtypeDecision(torch.float32, f"{EXACT_WHY} ({device.type})")
