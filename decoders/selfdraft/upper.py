"""Early exit's verification, layers k..L-1 over the drafted h_k, as one fixed-shape forward (issue 46).

EarlyExitDrafter.score runs the target's upper layers over h_k rows the draft already computed. With a fixed KV plan
(decoders/runtime/buffers.py) that forward goes the way the runner's own forwards go (decoders/runtime/graphs.py):
the rows are padded to the smallest bucket that holds them, the upper layers write at slots start.. of the target's
buffer and attend over the whole buffer under fixed_inputs' mask, so every forward of one width has one shape and
one set of addresses. With graphs on (CUDA) a width is captured at its second use and replayed from then on: one
host-to-device copy of the packed positions and a device copy of the rows into the captured input, then the graph;
eagerly (the CPU, or graphs off) the same function runs. Padding is by the smallest bucket, never by a timing: the
logits depend on the width by float rounding, and two runs must verify one draft alike.

The stem's layers 0..k-1 are not touched (they hold the round's drafts already); the upper layers' length is the
committed context, and a replay advances those layers alone. The graphs are kept with the target's FixedForward
(its `others`, in its memory pool), so they outlive the run as the target's own graphs do.
"""
from __future__ import annotations

import torch

from ..runtime import graphs
from ..runtime.buffers import BufferFull
from ..runtime.graphs import FixedForward, bucket, fixed_inputs, pack_inputs
from .stem import Rotary, run_layers, upper_layers


class _CapturedUpper(graphs._Captured):
    """One captured k..L-1 forward at one width: as the runner's (static packed input, its pinned host copy and the
    event of the last copy out of it, static outputs: logits (w, V) and features (w, d) after the final norm), plus
    the static rows (w, d) it reads h_k from."""

    def __init__(self, graph, packed: torch.Tensor, rows: torch.Tensor, logits: torch.Tensor, features: torch.Tensor):
        super().__init__(graph, packed, logits, features)
        self.rows = rows


class UpperForward:
    """Layers k..L-1, the final norm and the LM head over h_k rows, at a bucketed width over the target's buffer."""

    def __init__(self, model: torch.nn.Module, k: int, rotary: Rotary):
        self.model, self.k, self.rotary = model, k, rotary
        self.layers = upper_layers(model, k)

    @torch.inference_mode()
    def __call__(self, fixed: FixedForward, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows (n, d) h_k of the round's nodes, root first -> logits (n, V), features (n, d); the upper layers'
        buffers count n more entries."""
        n = rows.shape[0]
        width = bucket(n, fixed.buckets)
        cache = fixed.cache
        start = cache.layers[-1].length  # the upper layers' valid prefix: the committed context
        if start + width > cache.capacity:
            raise BufferFull(f"verifying {n} nodes over layers {self.k}.. (padded to {width}) after {start} would pass "
                             f"the KV buffer's {cache.capacity} slots (the run's budget was computed wrong)")
        packed = pack_inputs([0] * n, list(range(-1, n - 1)), start, width)  # (2w + 1 + w*w,) on the CPU: a chain
        key = ("upper", self.k, width)
        fixed.uses[key] = fixed.uses.get(key, 0) + 1
        fixed.widths.add(width)
        if fixed.replayable(width) and fixed.uses[key] > 1:  # a width used once is not worth a capture
            logits, features = self._replay(fixed, key, packed, rows, width, n)
            fixed.counts["graph"] += 1
        else:
            padded = rows.new_zeros(width, rows.shape[1])  # (w, d)
            padded[:n] = rows
            logits, features = self._run(fixed, packed.to(rows.device), padded, width, n)
            fixed.counts["eager"] += 1
        return logits[:n], features[:n]

    def _run(self, fixed: FixedForward, packed: torch.Tensor, rows: torch.Tensor, width: int, real: int):
        """The forward itself, tensor ops only (what a graph captures): (w, V) logits, (w, d) features."""
        cache = fixed.cache
        _, positions, slots, mask = fixed_inputs(packed, width, cache.capacity, self.model.dtype)
        with cache.fixed_write(slots, real):  # only the upper layers run, so only they write and count
            top = run_layers(self.layers, rows[None], positions, mask, self.rotary, cache)  # (1, w, d)
        features = self.model.get_decoder().norm(top)[0]  # (w, d)
        return self.model.get_output_embeddings()(features), features  # (w, V), (w, d)

    def _replay(self, fixed: FixedForward, key: tuple, packed: torch.Tensor, rows: torch.Tensor, width: int, n: int):
        captured = fixed.others.get(key)
        if captured is None:
            captured = fixed.others[key] = self._capture(fixed, packed.to(rows.device), rows, width)
        if captured.sent is not None:  # the staging buffer's last copy out must be done before it is overwritten
            captured.sent.synchronize()
        captured.host.copy_(packed)
        captured.packed.copy_(captured.host, non_blocking=True)  # the replay's one host-to-device copy (pinned)
        if captured.sent is not None:
            captured.sent.record()
        captured.rows[:n].copy_(rows)  # on the device; padding rows keep what they held (they see only themselves)
        captured.graph.replay()
        for layer in fixed.cache.layers[self.k:]:  # the captured writes ran no Python: count them here
            layer.length += n
        # Clones: the next replay of this width overwrites the static outputs; the loop keeps the features.
        return captured.logits.clone(), captured.hidden.clone()

    def _capture(self, fixed: FixedForward, packed: torch.Tensor, rows: torch.Tensor, width: int) -> _CapturedUpper:
        """Capture at this width; lengths are put back, so the first replay is the round's real forward."""
        static = rows.new_zeros(width, rows.shape[1])  # (w, d)
        static[:rows.shape[0]] = rows
        lengths = fixed.cache.lengths()
        graph, (logits, features), fixed.pool = graphs.capture(lambda: self._run(fixed, packed, static, width, 0),
                                                                fixed.pool)
        fixed.cache.set_lengths(lengths)
        return _CapturedUpper(graph, packed, static, logits, features)
