"""What verification and drafting cost on this machine: one cost curve per (machine, model, dtype, kernels, path).

t(n) = seconds of one forward over n new tokens after a fixed context / seconds of one over 1 token. A chain (the
causal mask) and a branching tree (the 4-D float mask, decoders/runtime/runner.py) take different code paths, so both are
timed. Each n is timed `repeats` times, interleaved with the other n (a slow moment of a shared machine spreads over
every n instead of bending one), and the median is kept; the curve is then made non-decreasing by pooling adjacent
violators (isotonic regression), because a forward over more tokens cannot really cost less: a dip is noise, and a
controller that trusted it would draft into it.

Measured once and cached in cache_dir()/costs.json under the machine's fingerprint (CPU model and flags, PyTorch
version, thread count), the model, the dtype, the kernels and the path the forwards take (PATHS: the KV cache kind,
and CUDA graphs or not); `measure(..., refresh=True)` times it again. The draft controller (decoders/controller.py),
the Race's t(n) panel and bench read it. A run is priced with the curve of its own path: an H200's graph path costs
t(2-4) = 1.21, t(5-32) = 1.38, t(33-64) = 1.52, far flatter than the eager DynamicCache's, whose curve capped the
graph runs' drafts at 32 (+ the root = 33, padded to 64). The controller prices verification no higher than the
repeats tell n tokens from one (`CostCurve.priced`, `beyond_noise`).

Each curve records what it was measured under: the load average per core (its 1-minute average when the timing
ended) and the context length. A controlled run (`for_run`) measures again when the stored curve was taken on a busy
machine and this one is quiet now, or at a context more than CONTEXT_SPAN times shorter or longer than the run's
prompt, and says in its trace which curve it weighed (trace.totals["cost_curve"]). Busy: more than BUSY_EXTRA
runnable tasks per core beyond the measuring process's own threads (on the 2-core CPU, a curve measured beside a
test suite read t(2)/t(1) = 1.5 where a quiet one reads ~1.1: with it, the controller drafts nothing once α falls
below one half).
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import functools
import json
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from .runtime.buffers import BUCKETS
from .runtime.model_files import cache_dir
from .tree import DraftTree

CACHE_NAME = "costs.json"
DEFAULT_NS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
QUICK_NS = (1, 2, 4, 8, 16, 32)  # what a run measures before its first round when nothing is cached (seconds)
DEFAULT_REPEATS = 5
DEFAULT_CONTEXT = 96  # tokens already in the cache when a forward is timed (a short prompt plus some output)
CONTEXT_SPAN = 4  # a curve serves runs whose prompt is within this factor of the context it was measured at
BUSY_EXTRA = 0.5  # runnable tasks per core, beyond the measuring threads' own share, that make a measurement "busy"
# How a run's forwards go (decoders/runtime/buffers.py KVPlan.path): transformers' DynamicCache, static buffers read as views,
# buffers at fixed padded widths run eagerly, or those replayed as CUDA graphs
PATHS = ("dynamic", "static", "fixed", "graphs")
# Paths whose forwards pad to a bucket (decoders/runtime/graphs.py): a forward of n tokens costs its bucket's, so t(n)
# is a step function, and a run on them measures every bucket (an H200: 32 tokens 1.38 steps, 33 padded to 64 1.57)
PADDED = ("fixed", "graphs")


@dataclass(frozen=True)
class CostCurve:
    """t(n)/t(1) of one model on one machine, as measured and as smoothed (non-decreasing)."""

    model: str
    dtype: str
    kernels: str
    machine: str  # a readable machine description (CPU or GPU name, threads)
    ns: tuple[int, ...]
    step_seconds: float  # t(1) in seconds: one token with all logits rows (as a verification forward)
    draft_step_seconds: float  # one token, last logits row only (as a drafter steps)
    chain: dict[int, float]  # smoothed t(n)/t(1), causal forward
    tree: dict[int, float]  # smoothed t(n)/t(1), tree-mask forward (a branching tree of n nodes)
    raw_chain: dict[int, float] = field(default_factory=dict)  # medians before smoothing
    raw_tree: dict[int, float] = field(default_factory=dict)
    spread: dict[int, tuple[float, float]] = field(default_factory=dict)  # chain: (min, max) seconds per n
    repeats: int = DEFAULT_REPEATS
    context_tokens: int = DEFAULT_CONTEXT
    measured_at: str = ""
    load_per_core: float | None = None  # the 1-minute load average per core when the timing ended (None: unknown)
    threads: int | None = None  # PyTorch threads the timing ran on (its own share of that load)
    path: str = "dynamic"  # the forwards' path it was timed on (PATHS); curves stored before paths were eager

    def busy(self) -> bool:
        """Measured while other work competed for the cores (unknown load: treated as busy, i.e. worth redoing)."""
        return self.load_per_core is None or is_busy(self.load_per_core, self.threads or 1)

    def t(self, n: int, tree: bool = False) -> float:
        """t(n)/t(1), linear between measured n and along the last segment beyond the largest; on a padded path
        (PADDED) that of the first measured n' >= n, which runs at the same bucket (every bucket is measured)."""
        return self._read(self.tree if tree else self.chain, n)

    def priced(self, n: int, tree: bool = False) -> float:
        """What the draft controller pays to verify n tokens: the chain's t(n)/t(1) no higher than its repeats can
        tell n from 1 (`beyond_noise`), read as t() reads (a padded path at n's bucket). Trees keep their medians
        (no spread is timed for them)."""
        return self._read(self.tree if tree else self._chain_beyond_noise, n)

    def _read(self, curve: dict[int, float], n: int) -> float:
        wider = [m for m in curve if m >= n]
        if self.path in PADDED and wider:
            return curve[min(wider)]
        return interpolate(curve, n)

    @functools.cached_property
    def _chain_beyond_noise(self) -> dict[int, float]:
        return beyond_noise(self.chain, self.spread)

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in ("chain", "tree", "raw_chain", "raw_tree", "spread"):
            data[key] = {str(n): v for n, v in data[key].items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CostCurve":
        known = {f.name for f in fields(cls)}  # a cache shared with another version may carry fields this one lacks
        data = {key: value for key, value in data.items() if key in known}
        for key in ("chain", "tree", "raw_chain", "raw_tree"):
            data[key] = {int(n): float(v) for n, v in data.get(key, {}).items()}
        data["spread"] = {int(n): tuple(v) for n, v in data.get("spread", {}).items()}
        data["ns"] = tuple(data["ns"])
        return cls(**data)


# ---------------------------------------------------------------- pure helpers

def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # each block: [sum, count]
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out = []
    for total, count in blocks:
        out += [total / count] * count
    return out


def smooth(seconds: dict[int, float]) -> dict[int, float]:
    """Seconds per n -> non-decreasing t(n)/t(1) with t(1) = 1 (n = 1 must be measured)."""
    ns = sorted(seconds)
    fitted = monotone([seconds[n] for n in ns])
    base = fitted[0]
    return {n: max(1.0, value / base) for n, value in zip(ns, fitted)}


def beyond_noise(curve: dict[int, float], spread: dict[int, tuple[float, float]]) -> dict[int, float]:
    """t(n)/t(1) lowered to the least its repeats allow, n's fastest timing over 1's slowest, then made
    non-decreasing again (1 at least). Where the spreads of n and 1 overlap the repeats cannot tell verifying n tokens
    from verifying one, and the price is 1; a curve whose repeats agree (a quiet machine) keeps about its medians.

    Why: on a busy machine a curve's medians carry the load of the moment. The Race's copy task (prompt lookup, whose
    drafts cost c = 0) weighed t(2)/t(1) = 1.75 from a busy curve, so one rejection priced every draft out: cap 0 in 3
    of 9 rounds of text it then copied, and the cost-aware preset trailed static γ = 4 (1.27x against 1.84x). A free
    drafter with a match loses nothing by drafting unless verifying more tokens surely costs more; a curve that is
    steep beyond its noise still prices drafts out."""
    if 1 not in spread or spread[1][1] <= 0:
        return dict(curve)  # an old cached curve without its spread: the medians, as before
    slowest_one = spread[1][1]
    lowered = {n: min(t, spread[n][0] / slowest_one) if n in spread else t for n, t in curve.items()}
    ns = sorted(lowered)
    return {n: max(1.0, value) for n, value in zip(ns, monotone([lowered[n] for n in ns]))}


def interpolate(curve: dict[int, float], n: int) -> float:
    points = sorted(curve.items())
    if n <= points[0][0]:
        return points[0][1]
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n <= n1:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    (n0, t0), (n1, t1) = points[-2], points[-1]
    return t1 + (t1 - t0) * (n - n1) / (n1 - n0)  # beyond the curve: the last segment's slope


def branching_tree(pending: int, n: int, vocab: int) -> DraftTree:
    """n draft nodes (plus the root) in a tree that branches: each node has up to two children, breadth first."""
    tree = DraftTree.root_only(pending)
    for i in range(n):
        tree.add(i // 2, (pending + 7 * i + 1) % vocab)
    return tree


# ---------------------------------------------------------------- measuring

@torch.inference_mode()
def time_forwards(model: torch.nn.Module, ns=DEFAULT_NS, repeats: int = DEFAULT_REPEATS,
                  context_tokens: int = DEFAULT_CONTEXT, trees: bool = True, path: str = "dynamic") -> dict:
    """Median seconds per n for chain (and, with `trees`, tree-mask) forwards and for a last-logits one-token step,
    interleaved, on `path` (PATHS) as a run on it pays them (with graphs: padded to the bucket a run pads to)."""
    from .runtime.buffers import KVPlan
    from .runtime.runner import CachedModel

    if max(ns) > context_tokens:
        raise ValueError(f"timing forwards of up to {max(ns)} tokens needs a context of at least that many")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    vocab = model.config.vocab_size
    context = [(17 * i + 3) % vocab for i in range(context_tokens)]
    kind = "fixed" if path == "graphs" else path
    runner = CachedModel(model, KVPlan(kind, committed=context_tokens + max(ns), graphs=path == "graphs"),
                         widest=max(ns))
    runner.forward(context, last_only=True)
    samples = {"chain": {n: [] for n in ns}, "tree": {n: [] for n in ns}, "step": {1: []}}

    def timed(kind: str, n: int, run) -> None:
        start = _now(runner.device)
        run()
        samples[kind][n].append(_now(runner.device) - start)
        runner.drop_last(n)

    try:
        for _ in range(2):  # first calls pay for kernel selection and allocation
            runner.forward(context[:4])
            runner.drop_last(4)
        for _ in range(repeats):
            timed("step", 1, lambda: runner.forward(context[:1], last_only=True))
            for n in ns:
                timed("chain", n, lambda: runner.forward(context[:n]))
                if trees:
                    timed("tree", n, lambda: runner.forward_tree(branching_tree(context[0], n - 1, vocab)))
    finally:
        runner.release()
    medians = {kind: {n: statistics.median(v) for n, v in per_n.items() if v} for kind, per_n in samples.items()}
    return medians | {"spread": {n: (min(v), max(v)) for n, v in samples["chain"].items()}}


def measure(lm, refresh: bool = False, ns=DEFAULT_NS, repeats: int = DEFAULT_REPEATS,
            context_tokens: int = DEFAULT_CONTEXT, path: str = "dynamic") -> CostCurve:
    """The cost curve of a loaded model (decoders.runtime.models.LoadedModel or any object with .name and .model); read
    from the cache unless refresh or never measured for this (machine, model, dtype, kernels, path) at about this
    context."""
    key = _key_of(lm, path)
    if not refresh:
        known = _best(_read(), key, min_points=len(ns), context_tokens=context_tokens)
        if known is not None:
            return known
    return _time_and_store(lm, key, ns, repeats, context_tokens)


def for_run(lm, prompt_tokens: int, ns=QUICK_NS, path: str = "dynamic") -> tuple[CostCurve, dict]:
    """The curve a controlled run on `path` (PATHS) weighs, measured again when the stored one was taken on a busy
    machine and this one is quiet now, or at a very different context; and what the trace says about it
    (totals["cost_curve"])."""
    key = _key_of(lm, path)
    if path in PADDED:
        ns = tuple(sorted(set(ns) | set(BUCKETS)))
    context = run_context(prompt_tokens, max(ns), getattr(lm, "context_length", None))
    stored = _best(_read(), key, min_points=len(ns), context_tokens=context)
    now = load_per_core()  # the run's threads are idle while it picks its curve
    quiet_now = now is not None and not is_busy(now, 0)  # an unknown load: no reason to measure again
    if stored is None:
        why = "none stored for this context" if _best(_read(), key, min_points=len(ns)) else "none stored"
    elif stored.busy() and quiet_now:
        why = "the stored one was measured on a busy machine"
    else:
        return stored, describe_use(stored, remeasured=False, why="stored")
    curve = _time_and_store(lm, key, ns, DEFAULT_REPEATS, context)
    return curve, describe_use(curve, remeasured=True, why=why)


def describe_use(curve: CostCurve, remeasured: bool, why: str) -> dict:
    """trace.totals["cost_curve"]: which curve a run weighed (keys the app's Race sentences read; keep the names)."""
    return {"measured_at": curve.measured_at, "age_seconds": _age_seconds(curve.measured_at),
            "load_per_core": curve.load_per_core, "context_tokens": curve.context_tokens, "remeasured": remeasured,
            "machine": curve.machine, "busy": curve.busy(), "why": why, "path": curve.path,
            "t": {str(n): v for n, v in curve.chain.items()}}


def run_context(prompt_tokens: int, longest: int, model_context: int | None = None) -> int:
    """The context a run's curve is measured at: DEFAULT_CONTEXT for prompts up to CONTEXT_SPAN times it, else the
    prompt length rounded up to a power of two (so nearby prompt lengths share one curve)."""
    if prompt_tokens <= DEFAULT_CONTEXT * CONTEXT_SPAN:
        return DEFAULT_CONTEXT
    context = 1 << (prompt_tokens - 1).bit_length()
    if model_context:
        context = min(context, model_context - longest)
    return max(context, DEFAULT_CONTEXT)


def is_busy(load: float, threads: int) -> bool:
    """More than BUSY_EXTRA runnable tasks per core beyond `threads` of our own (the 1-minute load average)."""
    return load - threads / (os.cpu_count() or 1) > BUSY_EXTRA


def load_per_core() -> float | None:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return None


def _time_and_store(lm, key: str, ns, repeats: int, context_tokens: int) -> CostCurve:
    model = lm.model
    device = next(model.parameters()).device
    _, _, dtype, kernel_kind, path = key.split("|")
    timings = time_forwards(model, ns, repeats, context_tokens=context_tokens, path=path)
    chain, tree_seconds = timings["chain"], timings["tree"]  # tree[n]: a root and n - 1 drafts that branch
    curve = CostCurve(model=lm.name, dtype=dtype, kernels=kernel_kind, machine=machine_description(device),
                      ns=tuple(ns), step_seconds=chain[1], draft_step_seconds=timings["step"][1],
                      chain=smooth(chain), tree=smooth(tree_seconds),
                      raw_chain={n: s / chain[1] for n, s in chain.items()},
                      raw_tree={n: s / chain[1] for n, s in tree_seconds.items()},
                      spread=timings["spread"], repeats=repeats, context_tokens=context_tokens,
                      measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      load_per_core=load_per_core(), threads=torch.get_num_threads(), path=path)
    _write(f"{key}|{len(ns)}x{repeats}|{context_tokens}", curve.to_dict())
    return curve


def _key_of(lm, path: str = "dynamic") -> str:
    from .runtime import kernels

    model = lm.model
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return cache_key(lm.name, dtype, kernels.kernels_of(model), next(model.parameters()).device, path)


def _age_seconds(measured_at: str) -> float | None:
    try:
        then = datetime.datetime.fromisoformat(measured_at)
    except ValueError:
        return None
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()


def cached(model_name: str, dtype: str, kernel_kind: str | None = None, device: str = "cpu",
           path: str = "dynamic") -> CostCurve | None:
    """A curve measured earlier on this machine, without loading or timing anything (None if never measured)."""
    from .runtime import kernels

    kinds = [kernel_kind] if kernel_kind else [kernels.PACKED, kernels.STOCK]  # packed: how the loader runs float32
    stored = _read()
    for kind in kinds:
        found = _best(stored, cache_key(model_name, dtype, kind, torch.device(device), path))
        if found is not None:
            return found
    return None


def _best(stored: dict, key: str, min_points: int = 1, context_tokens: int | None = None) -> CostCurve | None:
    """The most detailed curve stored under this (machine, model, dtype, kernels), if it has enough points (and was
    measured within CONTEXT_SPAN of `context_tokens`): a quiet one first, then the most points, then the newest."""
    curves = [CostCurve.from_dict(data) for name, data in stored.items() if _stored_under(name) == key.split("|")]
    curves = [curve for curve in curves if len(curve.ns) >= min_points and (
        context_tokens is None or _near(curve.context_tokens, context_tokens))]
    return max(curves, key=lambda curve: (not curve.busy(), len(curve.ns), curve.repeats, curve.measured_at),
               default=None)


def _stored_under(name: str) -> list[str]:
    """A stored curve's (machine, model, dtype, kernels, path); names written before paths were keyed end in the
    repeats ("6x5"), and were timed on the DynamicCache."""
    parts = name.split("|")
    if len(parts) < 5 or re.fullmatch(r"\d+x\d+", parts[4]):
        return parts[:4] + ["dynamic"]
    return parts[:5]


def _near(measured: int, wanted: int) -> bool:
    return wanted <= measured * CONTEXT_SPAN and measured <= wanted * CONTEXT_SPAN


def format_speedup(model_name: str, dtype: str) -> float | None:
    """How much faster a one-token step of `model_name` ran in `dtype` than in float32 on this machine, from the
    cached curves (None if either was never measured). The app labels the bfloat16 choice with it."""
    fast, exact = cached(model_name, dtype), cached(model_name, "float32")
    if fast is None or exact is None:
        return None
    return exact.step_seconds / fast.step_seconds


# ---------------------------------------------------------------- the machine and the cache

def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, PyTorch {torch.__version__}"
    from .runtime.dtype_choice import read_cpu_features

    cpu = read_cpu_features()
    return f"{cpu.model_name}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, PyTorch {torch.__version__}"


def cache_key(model_name: str, dtype: str, kernel_kind: str, device: torch.device, path: str = "dynamic") -> str:
    if device.type == "cuda":
        machine = torch.cuda.get_device_name(device)
    else:
        from .runtime.dtype_choice import read_cpu_features

        cpu = read_cpu_features()
        machine = json.dumps([cpu.model_name, sorted(cpu.flags)])
    fingerprint = hashlib.sha256(json.dumps([machine, torch.__version__, torch.get_num_threads()]).encode())
    return f"{fingerprint.hexdigest()[:12]}|{model_name}|{dtype}|{kernel_kind}|{path}"


def _path() -> Path:
    return cache_dir() / CACHE_NAME


def _read() -> dict:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}  # never measured, or a damaged file: measure again
    return data if isinstance(data, dict) else {}


def _write(key: str, record: dict) -> None:
    """Best effort and atomic: an unwritable cache costs the next process a measurement, never a failed run."""
    data = _read()
    data[key] = record
    with contextlib.suppress(OSError):
        path = _path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
