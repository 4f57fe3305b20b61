"""A drafter's small fixed-shape step, captured once as a CUDA graph and replayed, or run eagerly (issue 46).

The runner's forwards are captured by FixedForward (graphs.py); a self-drafter's own draft step (the prophet's one
row a step over its round cache) is smaller and keeps its position on the device, so it needs no packed host input
at all: `StepGraph` captures `forward(*inputs)` at its second call (the first runs eagerly, as FixedForward skips a
width used once) and from then on copies the new inputs into the captured ones on the device and replays. A
forward that moves state of its own (a slot counter it bumps) names those tensors as `state`: a capture runs the
forward three times (two warm-ups and the capture), so they are put back afterwards and the first replay is the
real step. Without graphs (the CPU, or graphs off) every call runs the same forward eagerly.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import graphs


class StepGraph:
    """One fixed-shape step: forward(*inputs) -> (a tensor, a tensor or None), inputs of one shape every call."""

    def __init__(self, forward: Callable[..., tuple], graphs_on: bool, state: tuple[torch.Tensor, ...] = ()):
        self.forward, self.graphs_on, self.state = forward, graphs_on, state
        self.inputs: tuple[torch.Tensor, ...] | None = None  # the captured graph's static inputs
        self.outputs: tuple | None = None  # its static outputs, overwritten by every replay
        self.graph = None
        self.pool = None
        self.calls = 0
        self.counts = {"graph": 0, "eager": 0}

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        self.calls += 1
        if not self.graphs_on or self.calls == 1:  # a step run once a run is not worth a capture
            self.counts["eager"] += 1
            return self.forward(*inputs)
        if self.graph is None:
            self._capture(inputs)
        for static, value in zip(self.inputs, inputs):
            static.copy_(value)  # device to device: nothing waits
        self.graph.replay()
        self.counts["graph"] += 1
        return tuple(None if out is None else out.clone() for out in self.outputs)  # the next replay overwrites

    def summary(self, capacity: int) -> dict:
        """The trace's runtime record of these steps (Trace.runtime; app/figures/runtime.py draws it): one row a
        step, so width 1."""
        return {"kv_cache": "fixed", "capacity": capacity, **self.counts, "widths": [1] if self.calls else []}

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> None:
        self.inputs = tuple(value.clone() for value in inputs)
        saved = [tensor.clone() for tensor in self.state]
        self.graph, self.outputs, self.pool = graphs.capture(lambda: self.forward(*self.inputs), self.pool)
        for tensor, value in zip(self.state, saved):  # the warm-ups and the capture moved it: the replay is the step
            tensor.copy_(value)


def one_row_mask(at: torch.Tensor, columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask (1, 1, 1, S) of one row written at slot `at` (a () device tensor) of a buffer whose valid
    prefix ends there: it sees slots 0..at (columns: (S,) arange) and nothing past them (stale or padding)."""
    allowed = columns <= at  # (S,)
    return torch.zeros(allowed.shape, dtype=dtype, device=columns.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)[None, None, None]  # (1, 1, 1, S)
