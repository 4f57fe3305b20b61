"""How the registry builds and prices the learned self-drafters (decoders/registry.py's early-exit and prophet
lines): their trained weights located and loaded for the target, their draft cost read from the weights' config, and
early exit's verification share. `ctx` is the registry's BuildContext (not imported here: the registry imports this
module, and tests/test_import_graph.py keeps decoders free of circles)."""
from __future__ import annotations

from typing import Callable

from ..errors import OptionsError


def builder(kind: str) -> Callable:
    """Early exit / prophet over the target, with trained weights: a folder, or "auto" (shipped or trained)."""
    def build(ctx):
        from ..drafters.early_exit import EarlyExitDrafter
        from ..drafters.prophet import ProphetDrafter
        from . import store

        source = ctx.options.self_weights
        try:
            module = store.load(store.locate(kind, ctx.options.model) if source == "auto" else source, ctx.runner.model)
        except (OSError, ValueError, RuntimeError, KeyError) as err:  # missing, or trained for another target
            raise OptionsError(f"{kind}: {err}") from None
        from ..runtime import kernels

        if kernels.kernels_of(ctx.runner.model) == kernels.PACKED:
            kernels.pack(module)  # the draft's own matmuls on the target's kernels (inference only)
        if kind == "early-exit":
            return EarlyExitDrafter(ctx.runner, module)
        return ProphetDrafter(module, ctx.runner.model.config.vocab_size)
    return build


def cost_prior(kind: str) -> Callable:
    """Early exit runs k target layers + 1 block, a prophet its own few layers: that share of the target's layers,
    read from the weights' config (the shipped SmolLM2 block exits at k = 2: 3/30, not the 5/30 once assumed)."""
    def prior(ctx) -> float:
        from ..runtime.runner import decoder_layers

        total = len(decoder_layers(ctx.runner.model))
        if kind == "early-exit":
            return (_exit_layer(ctx) + 1) / total
        return _self_config(ctx, kind).get("n_layers", 1) / total
    return prior


def early_exit_share(ctx) -> float:
    """Early exit's verification runs layers k+1..L only (the draft already ran 1..k): (L − k)/L of a full forward."""
    from ..runtime.runner import decoder_layers

    total = len(decoder_layers(ctx.runner.model))
    return (total - _exit_layer(ctx)) / total


def _exit_layer(ctx) -> int:
    return int(_self_config(ctx, "early-exit")["exit_layer"])


def _self_config(ctx, kind: str) -> dict:
    from . import store

    try:
        return store.read_config(kind, ctx.options.self_weights, ctx.options.model)
    except (OSError, ValueError) as err:  # missing weights: the drafter's own build says so first
        raise OptionsError(f"{kind}: {err}") from None
