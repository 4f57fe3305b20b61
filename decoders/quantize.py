"""Where an int8 draft pays: measured on this machine, never assumed.

A draft's precision changes only q, the distribution the drafts are drawn from; the target's p and the verification
are untouched, so an int8 draft keeps every method lossless (greedy output still equals the baseline; sampled output
still follows p). What it changes is the draft step's cost c and, through a slightly different q, the acceptance.
draft_quant "auto" turns it on for a draft model only where this machine's measured int8 draft step is faster than
the float32 one (decoders/costs.py, cached per machine); "int8" and "none" force it either way.
"""
from __future__ import annotations

from . import costs
from .runtime import kernels

MARGIN = 1.1  # int8 must be at least this much faster per draft step to be chosen (timing noise is ~5-10 %)


def resolve(draft_quant: str, name: str, device: str, load) -> str | None:
    """None or "int8" for a draft `name` to be loaded with `load(name, quant)`; "auto" measures once per machine."""
    if draft_quant == "none" or device != "cpu":
        return None
    if draft_quant == "int8":
        return kernels.INT8
    exact = costs.measure(load(name, None), ns=(1, 2, 4))
    int8 = costs.measure(load(name, kernels.INT8), ns=(1, 2, 4))
    return kernels.INT8 if exact.draft_step_seconds >= MARGIN * int8.draft_step_seconds else None
