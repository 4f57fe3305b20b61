"""Fixed-shape forwards over static KV buffers (decoders/runtime/buffers.py), run eagerly or replayed as CUDA graphs.

A forward of n tokens (a chain, or a draft tree by its parent array) after `start` valid slots:
  width        the smallest bucket >= n (buffers.BUCKETS); n past the widest bucket runs at its own width, eagerly
  ids (w,)     the tokens; padding rows carry token 0
  positions    start + depth of each node; a padding row sits at `start`
  ancestors    (w, w): row i may see block column k iff node k is on the path root -> i; a padding row sees only
               itself, and no real row sees a padding column
  slots (w,)   start .. start + w - 1, where every layer writes; padding lands past the valid prefix, unseen, and
               is overwritten by the next forward (the capacity leaves room for it: KVPlan.capacity)
  mask         (1, 1, w, S) additive over the whole buffer: slot j is visible to row i iff j < start (committed),
               or j = start + k with ancestors[i, k]. Sliding-window layers (Gemma 3) get that mask limited to keys
               within the window of the query's position.
The host packs (ids, positions, start, ancestors) into one int64 tensor; everything else is computed from it on the
model's device by `fixed_inputs`. So one captured graph per (width, hidden states or not) replays any round: a
replay is one host-to-device copy, the graph, and the caller's read of the outputs.

Why our own graphs and not torch.compile(mode="reduce-overhead") over transformers' StaticCache: on torch 2.11 with
transformers 5.23 that fails at the second call ("accessing tensor output of CUDAGraphs that has been overwritten",
from StaticLayer's cumulative_length.add_), and its cache has no rollback or tree compaction anyway. Capturing
torch.cuda.CUDAGraph around the stock model forward keeps the model unchanged, keeps the buffers' index moves in
Python between replays, and is the part a GPU session can check against eager token for token (tests/test_graphs.py).

A capture costs about three forwards (two warm-ups and the capture), more than a short run's whole decode on a fast
GPU, so with graphs on a model's buffers and graphs outlive the run: `lease` hands a run the model's kept
FixedForward of its capacity (free, i.e. not used by another runner right now, such as a draft model that is the
target itself) and `give_back` returns it, lengths reset. They are kept per model object, weakly: unloading the
model frees them; one whose model's weights moved since its capture (another device or dtype) is dropped, never
replayed over freed memory. Capacities are rounded up to a power of two (KVPlan.capacity) so runs of similar length
share them.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import statistics
import time
import weakref
from contextlib import contextmanager

import torch
from torch import nn

from . import kernels
from .buffers import BufferCache, BufferFull
from .features import pick_features
from .model_files import cache_dir
from ..tree import ancestor_mask, depths

BUCKET_TABLES = "buckets.json"  # in cache_dir(): each (device, model, dtype, kernels)'s replay seconds per bucket


def bucket(n: int, buckets: tuple[int, ...], seconds: dict[int, float] | None = None) -> int:
    """The width a forward of n tokens runs at: the smallest bucket that holds it, or n itself past the widest.
    With `seconds` (each bucket's measured replay), the cheapest bucket that holds it: a GPU's kernel choice can
    make a wider forward faster (SmolLM2-135M float32 on an H200, graphs: 16 tokens took 2.0 one-token steps, 32
    took 1.4), and padding rows cost nothing but their time. The seconds are timed once per device, model, dtype and
    kernels and stored (`table_key`, cache_dir()/buckets.json); later processes read them, never time again:
    logits depend on the width by float rounding (an H200 differed by 1.4e-5 between widths 16 and 32) and buckets
    2 and 4 time within noise, so widths chosen from each process's own timing could verify one draft at different
    widths and make two greedy runs diverge at a near-tie."""
    wide_enough = [b for b in sorted(buckets) if b >= n]
    if not wide_enough:
        return n
    if not seconds:
        return wide_enough[0]
    return min(wide_enough, key=lambda b: (seconds.get(b, float("inf")), b))


def pack_inputs(tokens: list[int], parents: list[int], start: int, width: int) -> torch.Tensor:
    """The host side of one fixed-shape forward: [ids (w) | positions (w) | start | ancestors (w*w)] as int64, on
    the CPU. Rows n..w-1 are padding (see the module docstring)."""
    n = len(tokens)
    packed = torch.zeros(2 * width + 1 + width * width, dtype=torch.long, device="cpu")  # (2w + 1 + w*w,)
    packed[:n] = torch.tensor(tokens, device="cpu")
    packed[width:width + n] = torch.tensor(depths(parents), device="cpu") + start
    packed[width + n:2 * width] = start  # padding rows: any position; nothing real attends to them
    packed[2 * width] = start
    ancestors = torch.eye(width, dtype=torch.long, device="cpu")  # (w, w): a padding row sees itself only
    ancestors[:n, :n] = ancestor_mask(parents).long()
    packed[2 * width + 1:] = ancestors.flatten()
    return packed


def fixed_inputs(packed: torch.Tensor, width: int, capacity: int, dtype: torch.dtype, window: int | None = None):
    """Unpack on the model's device: ids (1, w), positions (1, w), slots (w,), and the additive mask over the whole
    buffer (1, 1, w, S), or for a model with sliding-window layers {"full_attention": ..., "sliding_attention": ...}.
    Only tensor ops, no host reads: the same code runs eagerly and inside a captured graph."""
    ids = packed[:width][None]  # (1, w)
    positions = packed[width:2 * width][None]  # (1, w)
    start = packed[2 * width]  # () valid slots before this forward
    ancestors = packed[2 * width + 1:].view(width, width).bool()  # (w, w)
    slots = start + torch.arange(width, device=packed.device)  # (w,)
    relative = torch.arange(capacity, device=packed.device) - start  # (S,) slot index within the block
    inside = (relative >= 0) & (relative < width)  # (S,) the block's own slots
    column = relative.clamp(0, width - 1)  # (S,)
    allowed = (relative < 0)[None, :] | (inside[None, :] & ancestors[:, column])  # (w, S)
    mask = _additive(allowed, dtype)  # (1, 1, w, S)
    if window is None:
        return ids, positions, slots, mask
    key_positions = torch.where(relative < 0, relative + start, positions[0, column])  # (S,) slot -> position
    near = positions[0][:, None] - key_positions[None, :] < window  # (w, S) Gemma's rule: p - k < window
    return ids, positions, slots, {"full_attention": mask, "sliding_attention": _additive(allowed & near, dtype)}


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(w, S) bool -> (1, 1, w, S): 0 where allowed, the dtype's minimum elsewhere (eager attention adds it)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)[None, None]


class _Captured:
    """One captured forward at one width: its static input (the packed tensor, and a pinned host copy to send it
    from), its static outputs, and an event marking when the last copy out of the host copy finished."""

    def __init__(self, graph, packed: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor | None):
        self.graph, self.packed, self.logits, self.hidden = graph, packed, logits, hidden
        self.host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=packed.is_cuda)
        self.sent = torch.cuda.Event() if packed.is_cuda else None


class FixedForward:
    """A model's forwards over its BufferCache at bucketed widths: eager, or with graphs=True (CUDA only) captured
    once per (width, hidden) and replayed. Counts which ran how, for the trace (`summary`)."""

    def __init__(self, model: nn.Module, cache: BufferCache, buckets: tuple[int, ...], graphs: bool = False,
                 window: int | None = None):
        # The model weakly: _KEPT maps a model to its FixedForwards, and a value that held its key would keep every
        # model with graphs alive for good (a runner holds its model strongly while it runs).
        self._model = weakref.ref(model)
        self.cache, self.buckets, self.window = cache, tuple(buckets), window
        self.graphs = graphs
        self.leased = False  # held by a runner (graphs only: see lease)
        self.paused = False  # eager() is on: the layer list is not the one a graph captured (layer skip)
        self.captured: dict[tuple[int, bool], _Captured] = {}
        # Other fixed-shape forwards over this buffer, captured in this model's pool and kept with it (early exit's
        # layers k..L-1, decoders/selfdraft/upper.py): key -> what their owner captured; uses counted alike.
        self.others: dict[tuple, object] = {}
        self.uses: dict[tuple[int, bool], int] = {}  # forwards run per (width, hidden): a graph from the second on
        self.pool = None  # one memory pool shared by every graph of this model
        self.counts = {"graph": 0, "eager": 0}
        self.widths: set[int] = set()
        self.kernels = None  # the model's kernels when its graphs were captured (lease matches them)
        self.weights = None  # where the model's weights lived then (`weights_of`; lease matches them)
        self.choose_by_time = graphs  # pad to the cheapest measured bucket (`bucket`), from the stored table
        self.seconds: dict[int, float] | None = None  # median replay of each bucket, once read or timed

    @property
    def model(self) -> nn.Module:
        model = self._model()
        if model is None:
            raise RuntimeError("this FixedForward's model was freed; a runner must hold its model while it runs")
        return model

    @torch.inference_mode()
    def __call__(self, tokens: list[int] | torch.Tensor, parents: list[int], hidden: bool = False):
        """Logits (n, V) of every real row, and the last hidden states (n, H) if asked; the cache counts n more.
        tokens: a list, or an (n,) tensor on the model's device (a device chain's draft): the host packs the rest
        and the ids are written into the packed input on the device, so the forward reads nothing back."""
        n = len(tokens)
        if self.choose_by_time and self.seconds is None and self._replayable(max(self.buckets)):
            self.seconds = self._bucket_table()
        width = bucket(n, self.buckets, self.seconds if self.choose_by_time else None)
        start = self.cache.layers[0].length
        if start + width > self.cache.capacity:
            raise BufferFull(f"a forward of {n} tokens (padded to {width}) after {start} would pass the KV buffer's "
                             f"{self.cache.capacity} slots (the run's budget was computed wrong; kv_cache='dynamic' "
                             "avoids it)")
        on_device = isinstance(tokens, torch.Tensor)
        packed = pack_inputs([0] * n if on_device else tokens, parents, start, width)
        ids = tokens if on_device else None  # (n,) written over the packed ids on the device
        self.widths.add(width)
        key = (width, hidden)
        self.uses[key] = self.uses.get(key, 0) + 1
        if self._replayable(width) and self.uses[key] > 1:  # a width used once (the prefill) is not worth a capture
            logits, states = self._replay(packed, width, n, hidden, ids)
            self.counts["graph"] += 1
        else:
            logits, states = self._eager(_with_ids(packed.to(self._device()), ids), width, n, hidden)
            self.counts["eager"] += 1
        return logits[:n], (states[:n] if hidden else None)

    @contextmanager
    def eager(self):
        """Run eagerly inside (the layers are swapped, so no captured graph stands for this forward)."""
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused

    def summary(self) -> dict:
        return {**self.counts, "widths": sorted(self.widths),
                "captured": sorted({width for width, _ in self.captured} | {key[-1] for key in self.others}),
                **({"bucket_ms": {w: round(t * 1e3, 3) for w, t in self.seconds.items()}} if self.seconds else {})}

    def _bucket_table(self) -> dict[int, float]:
        """Each bucket's replay seconds as stored for this device, model, dtype and kernels, else timed now and stored
        (`bucket_table`). A timing that could not cover every bucket (a buffer too short) pads by the smallest
        bucket instead: a partial table would make this run's widths, and its logits, differ from the next one's."""
        key = table_key(self.model, self.buckets)
        stored = read_bucket_table(key)
        if stored is not None:
            return stored
        seconds = self._time_buckets()
        if set(seconds) != set(self.buckets):
            return {}
        store_bucket_table(key, seconds)
        return seconds

    @torch.inference_mode()
    def _time_buckets(self, repeats: int = 3) -> dict[int, float]:
        """Capture every bucket and time its replay (median of `repeats`, after one untimed): what `bucket` pads
        by. Replays write past the valid prefix only (the lengths do not move), where the next forward writes."""
        start = self.cache.layers[0].length
        seconds = {}
        for width in sorted(self.buckets):
            if start + width > self.cache.capacity:
                continue
            packed = pack_inputs([0] * width, list(range(-1, width - 1)), start, width)
            key = (width, False)
            if key not in self.captured:
                self.captured[key] = self._capture(packed, width, False)
            graph = self.captured[key].graph
            samples = []
            for rep in range(repeats + 1):
                self._sync()
                began = time.perf_counter()
                graph.replay()
                self._sync()
                if rep:
                    samples.append(time.perf_counter() - began)
            seconds[width] = statistics.median(samples)
        return seconds

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _sync(self) -> None:
        if self._device().type == "cuda":
            torch.cuda.synchronize()

    def replayable(self, width: int) -> bool:
        """A forward of this width over this buffer may replay a graph now (graphs on, not paused, a bucket, every
        layer's buffer allocated)."""
        return self._replayable(width)

    def _replayable(self, width: int) -> bool:
        return (self.graphs and not self.paused and width in self.buckets
                and all(layer.is_initialized for layer in self.cache.layers))

    def _eager(self, packed: torch.Tensor, width: int, n: int, hidden: bool):
        """One forward on device inputs; each layer writes its w slots and counts n of them. -> (w, V), (w, H)|None"""
        ids, positions, slots, mask = fixed_inputs(packed, width, self.cache.capacity, self.model.dtype, self.window)
        with self.cache.fixed_write(slots, n):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                             use_cache=True, output_hidden_states=bool(hidden))
        return out.logits[0], (pick_features(out.hidden_states, hidden)[0] if hidden else None)

    def _replay(self, packed: torch.Tensor, width: int, n: int, hidden: bool, ids: torch.Tensor | None = None):
        captured = self.captured.get((width, hidden))
        if captured is None:
            captured = self.captured[(width, hidden)] = self._capture(packed, width, hidden)
        if captured.sent is not None:  # the last asynchronous copy out of the staging buffer must be done before it is
            captured.sent.synchronize()  # overwritten (a caller that read the outputs waited for it already)
        captured.host.copy_(packed)
        captured.packed.copy_(captured.host, non_blocking=True)  # the one host-to-device copy of a replay
        _with_ids(captured.packed, ids)  # a device token: copied on the device, after the host copy in stream order
        if captured.sent is not None:
            captured.sent.record()
        captured.graph.replay()
        self.cache.advance(n)  # the captured writes ran no Python: count the valid entries here
        # Clones: the next replay of this width overwrites the static outputs, and callers keep rows (features).
        return captured.logits.clone(), (captured.hidden.clone() if hidden else None)

    def _capture(self, packed: torch.Tensor, width: int, hidden: bool) -> _Captured:
        """Capture this forward; the cache's lengths are put back afterwards, so the first replay is the round's real
        forward (the warm-ups wrote the same values at the same slots)."""
        static = packed.to(self._device())
        lengths = self.cache.lengths()
        graph, (logits, states), self.pool = capture(lambda: self._eager(static, width, 0, hidden), self.pool)
        self.cache.set_lengths(lengths)
        return _Captured(graph, static, logits, states)


def _with_ids(packed: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Write device token ids (n,) over the first n packed ids, in place (a device-to-device copy, no host read)."""
    if ids is not None:
        packed[:ids.shape[0]].copy_(ids)
    return packed


def capture(forward, pool=None):
    """torch.cuda.CUDAGraph of `forward()` (which must read and write only tensors that outlive the graph): warm-ups
    on a side stream first, as CUDA requires; `pool` is the memory pool to share (None: a new one). -> (graph, the
    outputs the captured forward returned, which every replay overwrites, the pool)"""
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = forward()
    return graph, outputs, pool

# ---------------------------------------------------------------- the bucket table, stored per device and model

def table_key(model: nn.Module, buckets: tuple[int, ...]) -> str:
    """What a bucket table is stored under: the device's name, PyTorch, the model's config (its shapes), dtype and
    kernels, and the buckets. Every process of one such model on one such device pads alike."""
    device = next(model.parameters()).device
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    described = [machine, torch.__version__, model.config.to_json_string(use_diff=False), str(model.dtype),
                 kernels.kernels_of(model), sorted(buckets)]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def read_bucket_table(key: str) -> dict[int, float] | None:
    entry = _read_tables().get(key)
    try:
        return {int(width): float(seconds) for width, seconds in entry["seconds"].items()}
    except (TypeError, KeyError, AttributeError, ValueError):  # none stored, or a damaged entry: time again
        return None


def store_bucket_table(key: str, seconds: dict[int, float]) -> None:
    """Best effort and atomic, like decoders/costs.py's curves: an unwritable cache costs the next process a timing
    (and possibly other widths), never a failed run."""
    tables = _read_tables()
    tables[key] = {"seconds": {str(w): s for w, s in sorted(seconds.items())},
                   "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with contextlib.suppress(OSError):
        path = cache_dir() / BUCKET_TABLES
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(tables, indent=1))
        os.replace(tmp, path)


def _read_tables() -> dict:
    try:
        tables = json.loads((cache_dir() / BUCKET_TABLES).read_text())
    except (OSError, ValueError):
        return {}
    return tables if isinstance(tables, dict) else {}


# model -> its FixedForwards with graphs, kept between runs (see the module docstring); one process-wide table, like
# the loaded models themselves (decoders/README.md, "Process-wide state"). The values hold their model weakly
# (FixedForward.model), so a model nobody else holds is freed with its buffers and graphs.
_KEPT: "weakref.WeakKeyDictionary[nn.Module, list[FixedForward]]" = weakref.WeakKeyDictionary()


def lease(model: nn.Module, capacity: int, buckets: tuple[int, ...], window: int | None) -> FixedForward:
    """The model's kept graph-replaying FixedForward of this capacity that no runner holds, or a new one."""
    forward = lease_kept(model, kernels.kernels_of(model), weights_of(model),
                         lambda kept: (isinstance(kept, FixedForward) and kept.cache.capacity == capacity
                                       and kept.buckets == tuple(buckets)),
                         lambda: FixedForward(model, BufferCache(model.config, capacity), buckets, graphs=True,
                                              window=window))
    forward.counts, forward.widths = {"graph": 0, "eager": 0}, set()  # this run's own figures
    forward.cache.reset()
    return forward


def lease_kept(model: nn.Module, kernels_now: str, weights: int, fits, make):
    """The model's kept object with graphs (a FixedForward, an EAGLE head's level steps: anything with `leased`,
    `kernels`, `weights` and a `cache`) that `fits` and no runner holds, or `make()`'s new one; marked leased. A
    graph replays the kernels it was captured with (stock and fused kept apart), and kept ones whose weights moved
    since their capture (`weights_of`) are dropped. `make` must hold the model weakly (see _KEPT)."""
    kept = _KEPT.setdefault(model, [])
    kept[:] = [forward for forward in kept if forward.leased or forward.weights == weights]
    for forward in kept:
        if not forward.leased and forward.kernels == kernels_now and forward.weights == weights and fits(forward):
            break
    else:
        forward = make()
        forward.kernels, forward.weights = kernels_now, weights
        kept.append(forward)
    forward.leased = True
    return forward


def weights_of(*models: nn.Module) -> int:
    """Where the models' parameters and buffers live (addresses, dtypes, devices), hashed. A captured graph reads
    the addresses it was captured with and runs no Python: after a move to another device or dtype (or the first
    fuse, which makes q/k/v views of a new joined weight, decoders/runtime/fused.py) the old tensors are freed and a replay
    would read freed memory. Fusing again after `unfuse` keeps the joined views, so their graphs stay valid."""
    where = []
    for tensor in [t for model in models for t in (*model.parameters(), *model.buffers())]:
        try:
            where.append((tensor.data_ptr(), tensor.dtype, str(tensor.device)))
        except RuntimeError:  # an opaque layout (oneDNN) has no address to compare: its object stands in
            where.append((id(tensor), tensor.dtype, str(tensor.device)))
    return hash(tuple(where))


def give_back(forward: FixedForward) -> None:
    """A run ended: its buffers' contents are void (lengths 0); buffers and graphs wait for the next run."""
    forward.cache.reset()
    forward.leased = False
