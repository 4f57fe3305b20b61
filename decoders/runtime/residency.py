"""Which loaded models stay in memory: a budget, least-recently-used eviction, and holds by running decodes.

Without this every (model, dtype) stayed resident for the life of the process: switching through the four models
in both dtypes held 22.7 GB of a 24 GB machine. Now decoders/runtime/models.py asks `make_room` before and after each load;
models that a running decode holds (api.stream holds its target and draft) are never evicted, and evicting one
really returns its memory (gc, the CUDA cache, glibc's free lists) as long as nobody else keeps a reference.

Budget: set_memory_budget(gb), else $SPECLAB_MEMORY_BUDGET_GB, else 60% of RAM on CPU / 80% of the GPU's memory.
RAM is the machine's as this process finds it: the container's memory limit where it has one (a Space's CPU basic
is a 16 GB container on a larger host, whose /proc/meminfo reports the host's RAM), else /proc/meminfo.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import torch
from torch import nn

from .model_files import ModelError

CPU_SHARE, GPU_SHARE = 0.6, 0.8  # default budget: what is left covers the app, activations and the KV caches
ENV_BUDGET = "SPECLAB_MEMORY_BUDGET_GB"
GB = 1e9


def gb_text(nbytes: float) -> str:
    """Bytes as GB with three significant digits (0.00271 GB, 1.12 GB, 14.4 GB), for status lines."""
    return f"{nbytes / GB:.3g} GB"

Progress = Callable[[str], None]

# ---------------------------------------------------------------- sizes and budgets

def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters, buffers and packed weights: each storage once (tied weights), by its whole
    size. A fused model's q/k/v (gate/up) are views of one joined storage (decoders/runtime/fused.py): counting the first
    view's own size under-counted SmolLM2 by a quarter, and the budget admitted models that did not fit."""
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), torch.Tensor)]
    sizes = {}
    for tensor in tensors:
        key, nbytes = _storage(tensor)
        sizes[key] = nbytes
    return sum(sizes.values()) + _int8_bytes(model)


def _int8_bytes(model: nn.Module) -> int:
    """int8 linears (decoders/runtime/kernels.py Int8Linear) keep their weights in packed params, not parameters (their bias
    and row sums are parameters and buffers, counted above)."""
    from .kernels import Int8Linear, is_int8

    total = 0
    for module in model.modules():
        if isinstance(module, Int8Linear):
            weight = module.int8_weight()
            total += weight.numel() * weight.element_size()
        elif is_int8(module):  # a torch.ao dynamic linear: weight and bias both packed
            weight, bias = module.weight(), module.bias()
            total += weight.numel() * weight.element_size() + (bias.numel() * bias.element_size() if bias is not None
                                                                else 0)
    return total


def _storage(tensor: torch.Tensor) -> tuple:
    """(what identifies the tensor's storage, the storage's bytes)."""
    try:
        storage = tensor.untyped_storage()
        return (storage.data_ptr(), tensor.device), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # opaque layouts (oneDNN's packed weights) have no plain storage
        return id(tensor), tensor.numel() * tensor.element_size()


# A container's memory limit: cgroup v2's file, then v1's ("max", or v1's page-rounded 2^63, means no limit)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_NO_LIMIT = 1 << 60


def total_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    ram = _meminfo_bytes()
    limit = cgroup_limit_bytes()
    return min(ram, limit) if limit else ram


def cgroup_limit_bytes() -> int | None:
    """The memory limit of the container this process runs in, or None where there is none."""
    for path in CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            text = open(path).read().strip()
            if text != "max" and 0 < int(text) < _NO_LIMIT:
                return int(text)
    return None


def _meminfo_bytes() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # kB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_BUDGET_GB: float | None = None  # process-wide on purpose: the budget of this process's one residency (models.py)


def set_memory_budget(gb: float | None) -> None:
    """Budget for resident models in GB (None: back to $SPECLAB_MEMORY_BUDGET_GB or the machine's default)."""
    global _BUDGET_GB
    _BUDGET_GB = None if gb is None else _positive_gb(gb, "set_memory_budget")


def memory_budget_bytes(device: torch.device) -> int:
    if _BUDGET_GB is not None:
        return int(_BUDGET_GB * GB)
    if os.environ.get(ENV_BUDGET, "").strip():
        return int(_positive_gb(os.environ[ENV_BUDGET], ENV_BUDGET) * GB)
    return int(total_memory_bytes(device) * (GPU_SHARE if device.type == "cuda" else CPU_SHARE))


def _positive_gb(value, where: str) -> float:
    try:
        gb = float(value)
    except (TypeError, ValueError):
        gb = float("nan")
    if not gb > 0 or gb == float("inf"):
        raise ModelError(f"{where} must be a positive number of gigabytes (e.g. 8 or 0.5), got {value!r}")
    return gb


def release_memory() -> None:
    """Give freed tensors back: collect cycles, empty PyTorch's CUDA cache, ask glibc to return free heap pages."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc only; elsewhere the allocator keeps its own policy


# ---------------------------------------------------------------- the resident set

@dataclass
class Resident:
    model: object  # a LoadedModel (anything with .name and .device)
    nbytes: int


class Residency:
    """Loaded models in least-recently-used order, plus how many running decodes hold each."""

    def __init__(self):
        self._lock = threading.Lock()  # bookkeeping only; loads are serialized by models._LOCK
        self._entries: OrderedDict[Hashable, Resident] = OrderedDict()
        self._holds: dict[int, list] = {}  # id(model) -> [model, count]; the reference keeps the id unique
        self._unloaded: dict[Hashable, int] = {}  # key -> bytes it had, for "loading X again" and size estimates

    def get(self, key: Hashable):
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)  # most recently used last
            return self._entries[key].model

    def add(self, key: Hashable, model, nbytes: int) -> None:
        with self._lock:
            self._entries[key] = Resident(model, nbytes)
            self._unloaded.pop(key, None)

    def was_unloaded(self, key: Hashable) -> int | None:
        """The bytes a model had when it was evicted, or None if it never was."""
        return self._unloaded.get(key)

    def used_bytes(self, device: torch.device) -> int:
        with self._lock:
            return sum(r.nbytes for r in self._entries.values() if str(r.model.device) == str(device))

    def make_room(self, device: torch.device, incoming: int, budget: int, say: Progress,
                  keep: Hashable | None = None) -> list[str]:
        """Evict least-recently-used, unheld models on `device` until resident + incoming fits the budget."""
        evicted, resident = [], None
        with self._lock:
            for key in list(self._entries):
                used = sum(r.nbytes for r in self._entries.values() if str(r.model.device) == str(device))
                if used + incoming <= budget:
                    break
                resident = self._entries[key]
                if key == keep or str(resident.model.device) != str(device) or id(resident.model) in self._holds:
                    continue
                del self._entries[key]
                self._unloaded[key] = resident.nbytes
                evicted.append(resident.model.name)
                say(f"unloading {resident.model.name} ({gb_text(resident.nbytes)}) to stay within the "
                    f"{gb_text(budget)} memory budget")
            resident = None  # not even this frame may keep the last evicted model alive
        if evicted:
            release_memory()
        return evicted

    @contextlib.contextmanager
    def hold(self, *models):
        """While inside, these models are not evicted (None and models this set never loaded are ignored)."""
        held = [m for m in models if m is not None]
        with self._lock:
            for model in held:
                self._holds.setdefault(id(model), [model, 0])[1] += 1
        try:
            yield
        finally:
            with self._lock:
                for model in held:
                    entry = self._holds[id(model)]
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._holds[id(model)]

    def describe(self, budget_of: Callable[[torch.device], int]) -> list[dict]:
        with self._lock:
            return [{"name": r.model.name, "dtype": str(getattr(r.model, "dtype", "")).removeprefix("torch."),
                     "device": str(r.model.device), "gb": round(r.nbytes / GB, 3), "held": id(r.model) in self._holds,
                     "budget_gb": round(budget_of(r.model.device) / GB, 1)} for r in self._entries.values()]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._unloaded.clear()
