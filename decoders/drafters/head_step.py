"""The EAGLE head's draft KV in one fixed buffer and its tree step at fixed shapes, run eagerly or replayed as CUDA
graphs (issue 46: a round on the device).

The buffer (decoders/runtime/buffers.py: the head's one layer, `capacity` slots) holds, in a round:
  slots 0 .. start-1             the committed pairs (f_i, t_{i+1}), fed by the drafter's catch-up (a growing prefix)
  slots start+fed .. +F-1        one level's frontier: its F nodes after the `fed` nodes of the levels before, in
                                 feeding order (device_tree.Frontier). Written at fixed slots and never counted valid,
                                 so a round's draft pairs vanish without a rollback and the next catch-up overwrites them
A level's shape (F, fed) follows from the tree's shape alone (EAGLE-2: F = min(width, K × the level before's F); a
static tree: its listed paths), so a level has one shape every round, and its step reads only
  tokens (F,)   features (F, d)   seen (F, fed): the ancestors' slots   start (): the committed length
and computes the rest on the device: the additive mask (1, 1, F, capacity) over the whole buffer (committed slots,
ancestors' slots, its own), the positions start - 1 + depth and the slots it writes. The frontier's tensors are
copied device to device into the level's own and `start` is set by fill_ (a kernel argument, no host data copied),
so a steady round uploads nothing here and reads nothing back.

With graphs (plan.graphs, CUDA) each level's step, the head's log-probs included, is captured at its second use by
decoders/runtime/graphs.capture (one memory pool for the head's levels) and replayed; eagerly (the CPU) the very same
function runs. Buffers and graphs are kept between runs like the target's (graphs.lease_kept / give_back).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..runtime import graphs, kernels
from ..runtime.buffers import BufferCache, BufferFull
from ..sampling import Warp
from .device_tree import Frontier
from .tree_draft import draft_log_probs


@dataclass
class _Level:
    """One level shape's own inputs (its step reads only these) and, once captured, its graph and outputs."""

    tokens: torch.Tensor  # (F,) long
    features: torch.Tensor  # (F, d)
    seen: torch.Tensor  # (F, fed) bool
    uses: int = 0
    graph: object = None  # torch.cuda.CUDAGraph once captured
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None  # what every replay overwrites: (F, d), (F, V)


class HeadSteps:
    """The head's BufferCache plus its per-level steps; `growable`: no plan sized it (the buffer doubles when full,
    dropping what was captured), else a full buffer is a bug (BufferFull)."""

    def __init__(self, head: nn.Module, capacity: int, graphs: bool = False, growable: bool = False):
        self._head = weakref.ref(head)  # weakly: kept in graphs._KEPT under the head, which a value must not hold
        self.cache = BufferCache(head.config, capacity)
        self.graphs, self.growable = graphs, growable
        self.leased = False
        self.kernels = self.weights = None  # set by graphs.lease_kept
        self.levels: dict[tuple, _Level] = {}
        self.start = torch.zeros((), dtype=torch.long, device=next(head.parameters()).device)  # () committed length
        self.pool = None  # one CUDA memory pool for every level's graph
        self.counts = {"graph": 0, "eager": 0}
        self.widths: set[int] = set()

    @property
    def head(self) -> nn.Module:
        head = self._head()
        if head is None:
            raise RuntimeError("these head steps' EAGLE head was freed; a drafter must hold its head while it runs")
        return head

    @property
    def length(self) -> int:
        return self.cache.layers[0].length

    @torch.inference_mode()
    def step(self, frontier: Frontier, previous: torch.Tensor, warp: Warp) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward over the frontier: each node's pair is (its parent's guessed feature, its token).
        previous (rows, d): the last step's guessed features, read at frontier.rows. -> guessed features (F, d),
        log q (F, V) over target ids. With graphs the outputs are the level's own, overwritten by its next replay."""
        if self.length + frontier.fed + frontier.size > self.cache.capacity:
            raise BufferFull(f"the head's frontier would pass its buffer's {self.cache.capacity} slots")
        key = (frontier.depth, frontier.size, frontier.fed, warp)
        level = self.levels.get(key) or self._new_level(key, previous)
        self.start.fill_(self.length)
        level.tokens.copy_(frontier.tokens)
        torch.index_select(previous, 0, frontier.rows, out=level.features)
        level.seen.copy_(frontier.seen)
        self.widths.add(frontier.size)
        return self._call(level, lambda: self._run(level, frontier.depth, warp))

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed pairs (tokens (n,), features (n, d)) after the valid prefix, causally, at one shape per n
        (a round's catch-up is 1 .. D + 1 pairs), counted valid after. -> the last pair's guessed feature (d,) and
        logits (V|N,): the root's, kept by the drafter past later replays (so copied)."""
        n = tokens.shape[0]
        if self.length + n > self.cache.capacity:
            raise BufferFull(f"{n} committed pairs would pass the head's buffer of {self.cache.capacity} slots")
        key = ("feed", n)
        level = self.levels.get(key) or self._new_level(key, features)
        self.start.fill_(self.length)
        level.tokens.copy_(tokens)
        level.features.copy_(features)
        hidden, logits = self._call(level, lambda: self._run_feed(level))
        self.cache.advance(n)  # written at fixed slots, counted here: a replay runs no Python
        return hidden.clone(), logits.clone()

    def _call(self, level: _Level, run) -> tuple[torch.Tensor, torch.Tensor]:
        """run() eagerly, or its graph: captured at the shape's second use (a shape seen once, such as the prompt's
        catch-up or a budget-cut round's level, is not worth a capture) and replayed after."""
        level.uses += 1
        if not (self.graphs and level.uses > 1):
            self.counts["eager"] += 1
            return run()
        if level.graph is None:
            level.graph, level.outputs, self.pool = graphs.capture(run, self.pool)
        level.graph.replay()
        self.counts["graph"] += 1
        return level.outputs

    def _new_level(self, key: tuple, previous: torch.Tensor) -> _Level:
        size, fed = (key[1], 0) if key[0] == "feed" else key[1:3]
        device = previous.device
        level = _Level(torch.zeros(size, dtype=torch.long, device=device),
                       torch.zeros(size, previous.shape[-1], dtype=previous.dtype, device=device),
                       torch.zeros(size, fed, dtype=torch.bool, device=device))
        self.levels[key] = level
        return level

    def _run(self, level: _Level, depth: int, warp: Warp) -> tuple[torch.Tensor, torch.Tensor]:
        """The step itself: reads the level's inputs and `start` only, so a graph of it replays any round."""
        head = self.head
        mask, positions, slots = level_inputs(self.start, level.seen, depth, self.cache.capacity,
                                              level.features.dtype)
        with self.cache.fixed_write(slots, 0):  # 0 valid: the draft pairs are dropped when the round ends
            hidden, logits = head(level.tokens[None], level.features[None], position_ids=positions, cache=self.cache,
                                  attention_mask=mask)  # (1, F, d), (1, F, V|N)
        return hidden[0], full_vocab(head, draft_log_probs(logits[0], warp))  # (F, d), (F, V)

    def _run_feed(self, level: _Level) -> tuple[torch.Tensor, torch.Tensor]:
        head, n = self.head, level.tokens.shape[0]
        relative = torch.arange(self.cache.capacity, device=self.start.device) - self.start  # (S,)
        rows = torch.arange(n, device=self.start.device)  # (n,)
        allowed = relative[None, :] <= rows[:, None]  # (n, S): the committed slots and the pairs up to itself
        dtype = level.features.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                          torch.finfo(dtype).min)
        with self.cache.fixed_write(self.start + rows, 0):  # counted by the caller (cache.advance)
            hidden, logits = head(level.tokens[None], level.features[None], position_ids=(self.start + rows)[None],
                                  cache=self.cache, attention_mask=mask[None, None])  # (1, n, d), (1, n, V|N)
        return hidden[0, -1], logits[0, -1]  # (d,), (V|N,)

    @torch.inference_mode()  # the buffers were made under inference mode
    def make_room(self, slots: int) -> None:
        """Room for `slots` slots (the committed pairs and a round's frontiers): a growable buffer doubles."""
        if slots <= self.cache.capacity:
            return
        if not self.growable:
            raise BufferFull(f"the head needs {slots} buffer slots, its plan gave {self.cache.capacity}")
        old = self.cache
        self.cache = BufferCache(self.head.config, max(slots, 2 * old.capacity))
        self.levels.clear()  # their graphs (if any) read the old buffer's addresses
        for new, layer in zip(self.cache.layers, old.layers):
            if layer.is_initialized:
                new.lazy_initialization(layer.keys, layer.values)
                new.keys[:, :, :layer.length] = layer.keys[:, :, :layer.length]
                new.values[:, :, :layer.length] = layer.values[:, :, :layer.length]
            new.length = layer.length

    def reset(self) -> None:
        """A run ended: its pairs are void; shapes without a graph (a prompt's catch-up, eager runs) are let go, so
        kept steps do not collect one input buffer per prompt length."""
        self.cache.reset()
        self.levels = {key: level for key, level in self.levels.items() if level.graph is not None}

    def summary(self) -> dict:
        """The trace's runtime["draft"] (Trace.runtime): how the head's level steps ran."""
        return {"kv_cache": "fixed", "capacity": self.cache.capacity, **self.counts, "widths": sorted(self.widths),
                "captured": sorted({key[1] for key, level in self.levels.items()
                                    if level.graph is not None and key[0] != "feed"})}


def level_inputs(start: torch.Tensor, seen: torch.Tensor, depth: int, capacity: int, dtype: torch.dtype):
    """A level step's mask (1, 1, F, S), positions (1, F) and write slots (F,) from start () and seen (F, fed), on
    their device, with no host read: slot j is visible to row i iff j < start (committed), j = start + k with
    seen[i, k] (an ancestor), or j = start + fed + i (itself)."""
    rows, fed = seen.shape
    device = seen.device
    relative = torch.arange(capacity, device=device) - start  # (S,) slot index after the committed ones
    ancestors = nn.functional.pad(seen, (0, 1))[:, relative.clamp(0, fed)]  # (F, S) column fed is False: past them
    own = relative[None, :] == fed + torch.arange(rows, device=device)[:, None]  # (F, S)
    allowed = (relative < 0)[None, :] | ancestors | own  # (F, S)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = (start - 1 + depth).expand(1, rows)  # (1, F) siblings share a position
    slots = start + fed + torch.arange(rows, device=device)  # (F,)
    return mask[None, None], positions, slots


def full_vocab(head: nn.Module, logq: torch.Tensor) -> torch.Tensor:
    """A reduced draft vocabulary's log-probs (…, N) scattered to target ids (…, V), -inf elsewhere."""
    if head.vocab_ids is None:
        return logq
    full = torch.full((*logq.shape[:-1], head.config.vocab_size), -torch.inf, dtype=logq.dtype,
                      device=logq.device)  # (…, V)
    full[..., head.vocab_ids] = logq
    return full


def lease_steps(head: nn.Module, capacity: int) -> HeadSteps:
    """The head's kept steps of this capacity that no drafter holds (buffers and captured graphs), or new ones. A
    graph also reads the target's embedding and LM head, so their weights and kernels are matched too."""
    used = (head, head.embedding, head.lm_head)
    now = "+".join(kernels.kernels_of(module) for module in used)
    steps = graphs.lease_kept(head, now, graphs.weights_of(*used),
                              lambda kept: isinstance(kept, HeadSteps) and kept.cache.capacity == capacity,
                              lambda: HeadSteps(head, capacity, graphs=True))
    steps.counts, steps.widths = {"graph": 0, "eager": 0}, set()  # this run's own figures
    steps.reset()
    return steps
