"""What `dtype="auto"` means on this machine: decided from what the hardware declares, cached per machine.

A timing race is not a decision: three fresh processes on one AVX2-only CPU once chose float32, float32, bfloat16
from a 0.1 s matmul probe. So the hardware's declared features decide:

- CUDA: bfloat16 on compute capability >= 8.0 (Ampere on: native bf16 tensor cores), else float16.
- CPU: bfloat16 only with native bf16 matmul (x86 flags avx512_bf16 or amx_bf16, with PyTorch's AVX512 kernels and
  oneDNN present); float32 when the flags are readable and say there is none (an AVX2 CPU computes a bf16 gemm
  about one pass per row: multi-row verification measured 4-7x slower than float32).
- Only when the flags are ambiguous (no /proc/cpuinfo, an ARM bf16 extension, bf16 flags but a PyTorch built
  without AVX512 kernels) a probe breaks the tie, with a wide margin: bf16 must be >= 1.5x faster on the multi-row
  shape and not slower on the one-row shape.

The CPU decision is written to cache_dir()/dtype-choice.json under a fingerprint of the machine (CPU model name,
flags, PyTorch version and kernel level), so every process on a machine decides the same, probe or not.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .model_files import cache_dir

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
PROBE_MARGIN = 1.5  # bf16 must beat float32 by this factor on the multi-row probe to win an ambiguous case
RULES_VERSION = 1  # part of the fingerprint: a change of these rules must not reuse old decisions
CACHE_NAME = "dtype-choice.json"


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
    flags: frozenset[str]  # empty when the OS does not expose them (then the flags are "ambiguous")
    torch_capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    onednn: bool


# ---------------------------------------------------------------- pure rules (unit-tested with faked features)

def decide_cuda(capability: tuple[int, int], device_name: str = "GPU") -> DtypeDecision:
    major, minor = capability
    if capability >= (8, 0):
        return DtypeDecision(torch.bfloat16, f"{device_name} (compute capability {major}.{minor}) has native "
                                             "bfloat16 tensor cores")
    return DtypeDecision(torch.float16, f"{device_name} (compute capability {major}.{minor} < 8.0) has no native "
                                        "bfloat16, so float16")


def decide_from_flags(cpu: CpuFeatures) -> DtypeDecision | None:
    """The decision the declared CPU features make on their own, or None when they are ambiguous."""
    native = sorted(cpu.flags & NATIVE_BF16_FLAGS)
    if native and cpu.torch_capability == "AVX512" and cpu.onednn:
        return DtypeDecision(torch.bfloat16, f"this CPU declares native bf16 matmul ({', '.join(native)})")
    if native:
        return None  # the hardware has it, but this PyTorch may not use it: let the probe say
    if cpu.flags and _is_x86(cpu.flags):
        level = "AVX-512" if "avx512f" in cpu.flags else "AVX2" if "avx2" in cpu.flags else "its vector"
        return DtypeDecision(torch.float32, f"this CPU has {level} but no native bf16 matmul (no avx512_bf16 / "
                                            "amx_bf16 flag): bf16 would be slower, so float32")
    return None  # no flags to read, or a non-x86 CPU whose bf16 support PyTorch may or may not use


def decide_from_probe(float32_seconds: dict[int, float], bf16_seconds: dict[int, float], why_ambiguous: str
                      ) -> DtypeDecision:
    """Tie-breaker: bf16 must win the multi-row shape by PROBE_MARGIN and not lose the one-row shape."""
    rows = max(float32_seconds)
    speedup = float32_seconds[rows] / bf16_seconds[rows]
    one_row_ok = bf16_seconds[1] <= float32_seconds[1]
    if speedup >= PROBE_MARGIN and one_row_ok:
        return DtypeDecision(torch.bfloat16, f"{why_ambiguous}; a probe measured bf16 {speedup:.1f}x faster on "
                                             f"{rows}-row matmuls (needs >= {PROBE_MARGIN}x)")
    return DtypeDecision(torch.float32, f"{why_ambiguous}; a probe measured bf16 only {speedup:.1f}x on {rows}-row "
                                        f"matmuls (needs >= {PROBE_MARGIN}x), so float32")


def _is_x86(flags: frozenset[str]) -> bool:
    return bool(flags & {"sse2", "avx", "avx2", "avx512f"})


# ---------------------------------------------------------------- this machine

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


def fingerprint(cpu: CpuFeatures) -> str:
    text = json.dumps([RULES_VERSION, cpu.model_name, sorted(cpu.flags), cpu.torch_capability, cpu.onednn,
                       torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_DECIDED: dict[str, DtypeDecision] = {}  # per process: "cpu" or "cuda:N"


def dtype_decision(device: torch.device) -> DtypeDecision:
    """dtype="auto" for a device, with the one-line reason; the same in every process on a machine."""
    key = str(device) if device.type == "cuda" else device.type
    if key not in _DECIDED:
        _DECIDED[key] = _decide(device)
    return _DECIDED[key]


def _decide(device: torch.device) -> DtypeDecision:
    if device.type == "cuda":
        return decide_cuda(torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return _cpu_decision(read_cpu_features())
    return DtypeDecision(torch.float16, f"{device.type}: half precision is this backend's fast path")


def _cpu_decision(cpu: CpuFeatures) -> DtypeDecision:
    by_flags = decide_from_flags(cpu)
    if by_flags is not None:  # deterministic already; recorded so the app and other processes can read it
        return _remember(cpu, lambda: by_flags)
    return _remember(cpu, lambda: decide_from_probe(*_probe(), why_ambiguous=_why_ambiguous(cpu)))


def _why_ambiguous(cpu: CpuFeatures) -> str:
    if not cpu.flags:
        return "this OS does not list CPU flags"
    if cpu.flags & NATIVE_BF16_FLAGS:
        return (f"this CPU declares bf16 but PyTorch runs {cpu.torch_capability} kernels"
                f"{'' if cpu.onednn else ' without oneDNN'}")
    return "this CPU's flags do not say whether PyTorch has native bf16 matmul for it"


def _remember(cpu: CpuFeatures, decide) -> DtypeDecision:
    """The machine's recorded decision if there is one, else decide (under a file lock) and record it."""
    path = cache_dir() / CACHE_NAME
    key = fingerprint(cpu)
    with _file_lock(path.with_suffix(".lock")):
        recorded = _read(path).get(key)
        if recorded and recorded.get("dtype") in ("float32", "bfloat16"):
            return DtypeDecision(getattr(torch, recorded["dtype"]), recorded["why"])
        decision = decide()
        _write(path, key, {"dtype": decision.name, "why": decision.why, "cpu": cpu.model_name,
                           "torch": torch.__version__, "decided_at": time.strftime("%Y-%m-%d %H:%M:%S")})
        return decision


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: decide again (the rules give the same answer)
    return data if isinstance(data, dict) else {}


def _write(path: Path, key: str, record: dict) -> None:
    """Best effort and atomic: an unwritable cache costs the next process a probe, never a failed load."""
    data = _read(path)
    data[key] = record
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)


@contextlib.contextmanager
def _file_lock(path: Path):
    """One decider at a time per machine, so two processes cannot record different probe results."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a")
    except (ImportError, OSError):  # no fcntl (Windows) or read-only cache: decide without the lock
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _probe(rows: int = 8) -> tuple[dict[int, float], dict[int, float]]:
    """What a model does: F.linear with a (4096, 1024) weight on 1 row (a decode step) and `rows` (a verification)."""
    return ({n: _linear_seconds(torch.float32, n) for n in (1, rows)},
            {n: _linear_seconds(torch.bfloat16, n) for n in (1, rows)})


def _linear_seconds(dtype: torch.dtype, rows: int, reps: int = 7) -> float:
    x, weight = torch.randn(rows, 1024, dtype=dtype), torch.randn(4096, 1024, dtype=dtype)  # (rows, in), (out, in)
    torch.nn.functional.linear(x, weight)  # warm-up: first calls pay for kernel selection
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.nn.functional.linear(x, weight)  # (rows, out)
        best = min(best, time.perf_counter() - start)  # min: robust to other processes sharing the cores
    return best
