"""Options -> a batched run: what batch decoding accepts (with fix-it messages) and how it is built."""
from __future__ import annotations

from dataclasses import replace

from ..runtime import cache as kv
from .. import registry
from ..drafters import NoDraft
from ..options import DecodeOptions, OptionsError
from ..registry import BuildContext, Family
from .drafters import FORMS, BatchDrafter, PerRow

MAX_BATCH = 8


def batched_drafters() -> tuple[str, ...]:
    return tuple(name for name, spec in registry.DRAFTERS.items() if spec.batched is not None)


def check_batch(options: DecodeOptions, n_prompts: int, seeds: list[int] | None,
                max_new_tokens: list[int] | None = None) -> None:
    """Refuse what batch decoding does not do, saying what to pick instead."""
    options.validate()
    if not 1 <= n_prompts <= MAX_BATCH:
        raise OptionsError(f"batch decoding takes 1 to {MAX_BATCH} prompts, got {n_prompts}; "
                           + ("add a prompt" if n_prompts < 1 else f"split them into batches of {MAX_BATCH}"))
    if seeds is not None and len(seeds) != n_prompts:
        raise OptionsError(f"seeds gives {len(seeds)} seeds for {n_prompts} prompts; give one seed per prompt "
                           "(or none: every row then uses options.seed)")
    if seeds is not None and not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise OptionsError(f"seeds must be whole numbers, got {seeds!r}")
    if max_new_tokens is not None:
        if len(max_new_tokens) != n_prompts:
            raise OptionsError(f"max_new_tokens gives {len(max_new_tokens)} budgets for {n_prompts} prompts; give "
                               "one per prompt (or none: every row then uses options.max_new_tokens)")
        for cap in max_new_tokens:
            replace(options, max_new_tokens=cap).validate()  # the same range check and message as one run's
    family = registry.method(options.method).family
    if family == Family.BEAM:
        raise OptionsError(f"{options.method} keeps several beams per prompt; batch decoding runs the baseline and "
                           "speculative decoding: use method 'baseline' or 'speculative'")
    if options.method == "speculative" and options.drafter not in batched_drafters():
        raise OptionsError(f"batch decoding runs the chain drafters ({', '.join(batched_drafters())}); drafter "
                           f"'{options.drafter}' has no batched form yet: pick one of those")
    if options.method == "speculative" and options.controller != "off":
        raise OptionsError("the cost controller times one row's rounds; batch decoding uses the draft-length rules "
                           "as they are: set controller 'off'")


def check_model(model) -> None:
    if kv.sliding_window(model) is not None:
        raise OptionsError("this model has sliding-window attention layers, which batch decoding's ragged mask "
                           "does not handle yet; pick a model whose layers all attend to the full past "
                           "(SmolLM2, Qwen2.5)")


def build_drafter(ctx: BuildContext, batch: int) -> BatchDrafter:
    if ctx.options.method == "baseline":
        return PerRow([NoDraft() for _ in range(batch)])
    spec = registry.drafter(ctx.options.drafter)
    return FORMS[spec.batched](ctx, batch, lambda: spec.build(ctx))
