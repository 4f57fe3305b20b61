"""The Python API: options + prompt in, a streamed or finished Trace out.

    from decoders import DecodeOptions, generate
    trace = generate(DecodeOptions(model="smollm2-135m", method="speculative", drafter="prompt-lookup"),
                     "Repeat after me: the quick brown fox")
    print(trace.output_text, trace.totals["tau"])

`stream(...)` yields the same live Trace after every round (copy it if you need snapshots). Models come from
decoders/runtime/models.py unless passed in (tests pass tiny random-init models).
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Iterator, Protocol

import torch

from .runtime import buffers, kernels
from .batch.ragged import RaggedRunner
from .batch.trace import BatchTrace
from .beams import run as beam_run
from .compare import compare
from .drafters.suffix import SuffixStore
from . import registry
from .loop import run_rounds
from .options import DecodeOptions, OptionsError
from .recorder import TraceBuilder
from .registry import BuildContext, Family, uses_draft_model
from .runtime.runner import CachedModel
from .sampling import Warp, seeded_generator
from .trace import Trace


class LanguageModel(Protocol):
    """What the decoders need from a loaded model (decoders.runtime.models.LoadedModel satisfies it)."""

    name: str
    model: torch.nn.Module
    dtype: torch.dtype
    device: torch.device
    source: str
    eos_token_ids: tuple[int, ...]
    context_length: int

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def stream(options: DecodeOptions, prompt: str | list[int], target: LanguageModel | None = None,
           draft: LanguageModel | None = None, store: SuffixStore | None = None) -> Iterator[Trace]:
    """Validate, load what is missing, and decode round by round. store: earlier outputs suffix decoding may draft
    from (decoders/drafters/suffix.py; one per visitor and target model); the run reads it and never adds to it."""
    options.validate()
    if draft is None:
        check_draft_before_loading(options, target)  # seconds, where loading the weights first took a minute
    with contextlib.ExitStack() as holding:  # the models in use stay loaded (not evicted) until this generator ends
        target = target or _load(options.model, options)
        holding.enter_context(_hold(target))  # before the draft loads: that load may evict to fit the budget
        prompt_ids = _prompt_ids(target, prompt, options)
        if uses_draft_model(options):
            draft = draft or load_draft(draft_for(options), options)
            holding.enter_context(_hold(draft))
            _check_pair(target, draft, own_tokenizer(options))
        if registry.method(options.method).family == Family.BEAM:  # several beams: decoders/beams (its own live trace, schema 2)
            models = {"target": _describe(target), "draft": _describe(draft) if draft is not None else None}
            yield from beam_run.stream_beams(options, target, draft, prompt_ids,
                                             beam_run.new_trace(options, models, prompt, prompt_ids))
            return
        plan = kv_plan(options, target.model, len(prompt_ids))
        runner = CachedModel(target.model, plan, widest=_widest_verification(options))
        context = BuildContext(options, runner, target, draft, store)
        drafter = registry.build_drafter(context)
        drafter.use_kv(plan)
        costs = registry.run_costs(context, len(prompt_ids))
        rule = registry.build_rule(options, costs)
        builder = TraceBuilder(_new_trace(options, target, draft, prompt, prompt_ids), target.decode, options.record)
        if costs is not None:
            builder.extra_totals["cost_curve"] = costs.used  # which t(n) the controller weighed, and why
        generator = seeded_generator(runner.device, options.seed)  # on the model's device, like its logits
        warp = Warp(options.temperature, options.top_k, options.top_p)
        yield from run_rounds(runner, drafter, rule, warp, prompt_ids, options.max_new_tokens,
                              set(target.eos_token_ids), generator, builder)


def kv_plan(options: DecodeOptions, model: torch.nn.Module, prompt_tokens: int) -> buffers.KVPlan:
    """How this run keeps its KV caches (options.kv_cache on the model's device; decoders/runtime/buffers.py): buffers hold
    the prompt and max_new_tokens, plus what each model writes beyond them."""
    device = next(model.parameters()).device
    kind = buffers.resolve(options.kv_cache, device, options.cuda_graphs)
    buffers.check_graphs(options.cuda_graphs, device)
    return buffers.KVPlan(kind, committed=prompt_tokens + options.max_new_tokens, graphs=options.cuda_graphs)


def _widest_verification(options: DecodeOptions) -> int:
    """The most tokens one verification writes after the committed ones: a tree's M nodes and its root. A chain's
    drafts never pass max_new_tokens (the loop caps them), so its block fits the committed budget."""
    return registry.drafter(options.drafter).nodes(options) + 1 if registry.is_tree(options) else 0


def generate(options: DecodeOptions, prompt: str | list[int], target: LanguageModel | None = None,
             draft: LanguageModel | None = None, compare_baseline: bool = False,
             store: SuffixStore | None = None) -> Trace:
    """Blocking call: drain `stream` and return the finished trace. compare_baseline=True also decodes the baseline
    on the same prompt, model and dtype and puts decoders/compare.py's verdict in trace.baseline_check (where the
    outputs differ, the first differing position is re-scored in float64 on the target)."""
    if compare_baseline and registry.method(options.validate().method).family == Family.BEAM:
        raise OptionsError(f"{options.method} searches for another output than greedy decoding by design, so it has "
                           "no token-for-token baseline check; compare_baseline applies to chain and tree methods")
    trace = None
    for trace in stream(options, prompt, target, draft, store):
        pass
    if trace is None:  # unreachable: every run has at least one round
        raise RuntimeError("the decoder produced no round")
    if compare_baseline:
        baseline = generate(replace(options, method="baseline", record=False), prompt, target)
        lm = target or _load(options.model, options)  # loaded by the runs above: a cache hit
        with _hold(lm):  # re-scoring a differing position runs the target once more (decoders/rescore.py)
            trace.baseline_check = compare(trace, baseline, lm.model).to_dict()
    return trace


def stream_batch(options: DecodeOptions, prompts: list[str | list[int]], seeds: list[int] | None = None,
                 target: LanguageModel | None = None, draft: LanguageModel | None = None,
                 max_new_tokens: list[int] | None = None) -> Iterator[BatchTrace]:
    """Decode B prompts together (decoders/batch), yielding the live BatchTrace (a list of the rows' Traces) after
    every batched round. Row r samples exactly as generate(options with seed=seeds[r], prompts[r]) would
    (max_new_tokens: each row's own budget, default options.max_new_tokens for every row)."""
    from .batch import loop as batch_loop, run as batch_run

    prompts = list(prompts) if isinstance(prompts, (list, tuple)) else prompts
    if not isinstance(prompts, list) or not all(isinstance(p, str) or (isinstance(p, (list, tuple)) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in p)) for p in prompts):
        raise OptionsError("prompts must be a list of prompts, one per row: each a text or a list of token ids")
    batch_run.check_batch(options, len(prompts), seeds, max_new_tokens)
    seeds = list(seeds) if seeds is not None else [options.seed] * len(prompts)
    row_options = [replace(options, seed=seed, max_new_tokens=cap) for seed, cap in
                   zip(seeds, max_new_tokens or [options.max_new_tokens] * len(prompts))]
    if draft is None:
        check_draft_before_loading(options, target)
    with contextlib.ExitStack() as holding:
        target = target or _load(options.model, options)
        holding.enter_context(_hold(target))
        batch_run.check_model(target.model)
        prompt_ids = [_prompt_ids(target, prompt, row) for prompt, row in zip(prompts, row_options)]
        if uses_draft_model(options):
            draft = draft or load_draft(draft_for(options), options)
            holding.enter_context(_hold(draft))
            _check_pair(target, draft)
        runner = RaggedRunner(target.model, len(prompts))
        drafter = batch_run.build_drafter(BuildContext(options, runner, target, draft), len(prompts))
        builders = [TraceBuilder(_new_trace(row, target, draft, prompt, ids), target.decode, options.record)
                    for prompt, ids, row in zip(prompts, prompt_ids, row_options)]
        batch = BatchTrace([b.trace for b in builders], options.to_dict(), "batched " + label(options))
        rules = [registry.build_rule(options) for _ in prompts]
        generators = [seeded_generator(runner.device, seed) for seed in seeds]
        warp = Warp(options.temperature, options.top_k, options.top_p)
        yield from batch_loop.run_batch_rounds(runner, drafter, rules, warp, prompt_ids,
                                               [row.max_new_tokens for row in row_options], set(target.eos_token_ids),
                                               generators, builders, batch)


def generate_batch(options: DecodeOptions, prompts: list[str | list[int]], seeds: list[int] | None = None,
                   target: LanguageModel | None = None, draft: LanguageModel | None = None,
                   max_new_tokens: list[int] | None = None) -> BatchTrace:
    """Blocking call: drain stream_batch; returns one Trace per row (with .output_ids), plus the batch's rounds."""
    batch = None
    for batch in stream_batch(options, prompts, seeds, target, draft, max_new_tokens):
        pass
    if batch is None:  # unreachable: every run has at least one round
        raise RuntimeError("the batch decoder produced no round")
    return batch


def _prompt_ids(target: LanguageModel, prompt: str | list[int], options: DecodeOptions) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise OptionsError("the prompt is empty; type something for the model to continue")
        ids = target.encode_prompt(prompt, chat=options.chat)
    else:
        ids = list(prompt)
    if not ids:
        raise OptionsError("the prompt encodes to no tokens; type something for the model to continue")
    if options.max_new_tokens > target.context_length - len(ids):
        raise OptionsError(_too_long(len(ids), options.max_new_tokens, target.context_length, target.name))
    return ids


def _too_long(n_prompt: int, max_new: int, context: int, name: str) -> str:
    """How much to cut: the prompt's tokens over what the context leaves for max_new_tokens (or any new token)."""
    room = context - n_prompt
    head = f"the prompt is {n_prompt} tokens; {name}'s context is {context} tokens"
    if room >= 1:
        return (f"{head}, which leaves room for {room} new tokens, not {max_new}: cut at least "
                f"{n_prompt + max_new - context} tokens from the prompt or lower max new tokens to {room}")
    return (f"{head}: cut at least {n_prompt + max_new - context} tokens from the prompt to generate {max_new} new "
            f"tokens (at least {1 - room} to generate any)")


def draft_for(options: DecodeOptions) -> str | None:
    """The draft model a run needs: None unless the drafter is a draft model; the registry's pairing by default
    (for a drafter whose draft has its own tokenizer, the registry's cross-tokenizer pairing)."""
    if not uses_draft_model(options):
        return None
    if options.draft_model:
        return options.draft_model
    from .runtime import models  # the registry knows which draft pairs with which target

    field = "cross_draft" if own_tokenizer(options) else "default_draft"
    entry = models.REGISTRY.get(options.model)
    if entry is None or getattr(entry, field) is None:
        pairs = [f"{n} (draft {getattr(e, field)})" for n, e in models.REGISTRY.items() if getattr(e, field)]
        raise OptionsError(f"{options.model} has no default draft model for drafter '{options.drafter}'; pass "
                           f"draft_model=... or pick a target that has one: {', '.join(pairs)}")
    return getattr(entry, field)


def own_tokenizer(options: DecodeOptions) -> bool:
    """Does this run's draft model speak a tokenizer of its own (registry: DrafterSpec.own_tokenizer)?"""
    return options.method == "speculative" and registry.drafter(options.drafter).own_tokenizer


def _load(name: str, options: DecodeOptions, quant: str | None = None, progress=None) -> LanguageModel:
    from .runtime import models

    return models.load_model(name, dtype=options.dtype, device=options.device, quant=quant, progress=progress)


def load_draft(name: str, options: DecodeOptions, progress=None) -> LanguageModel:
    """The draft, int8 where decoders/quantize.py says it pays (float32 CPU runs only: a bf16 run keeps its draft).
    The one way a draft is loaded for these options: the API, the CLI, bench and the app all come through here, so
    every one of them races the same draft. progress: decoders.runtime.models' loading callback."""
    from . import quantize
    from .runtime import models

    device = models.resolve_device(options.device)
    if models.resolve_dtype(options.dtype, device) != torch.float32:
        return _load(name, options, progress=progress)
    quant = quantize.resolve(options.draft_quant, name, device.type, lambda n, q: _load(n, options, q))
    return _load(name, options, quant, progress)


def _hold(model: LanguageModel):
    from .runtime import models

    return models.hold(model)


def check_draft_before_loading(options: DecodeOptions, target: LanguageModel | None = None) -> None:
    """A registry draft's tokenizer against the target's before any weights load (the app calls it too)."""
    name = draft_for(options)
    if name is None:
        return
    from .runtime import models

    if own_tokenizer(options):  # another tokenizer is the point; the drafter checks both spell text when built
        return
    models.check_pair_before_loading(target if target is not None else options.model, name)


def _check_pair(target: LanguageModel, draft: LanguageModel, own_tokenizer: bool = False) -> None:
    """own_tokenizer: the drafter re-tokenizes, so the vocabularies may differ (it checks that both spell text)."""
    if not own_tokenizer:
        _check_one_vocabulary(target, draft)
    target_device, draft_device = (next(lm.model.parameters()).device for lm in (target, draft))
    if draft_device != target_device:  # q and p meet in one residual, both drawn with the run's one generator
        raise OptionsError(f"draft {draft.name} is on {draft_device} but the target {target.name} is on "
                           f"{target_device}; load both on the same device")


def _check_one_vocabulary(target: LanguageModel, draft: LanguageModel) -> None:
    if getattr(target, "tokenizer", None) is not None and getattr(draft, "tokenizer", None) is not None:
        from .runtime import models

        models.check_tokenizers_compatible(target, draft)
    if target.model.config.vocab_size != draft.model.config.vocab_size:
        raise OptionsError(f"draft {draft.name} has a vocabulary of {draft.model.config.vocab_size} tokens but the "
                           f"target {target.name} has {target.model.config.vocab_size}; pick a draft from the same "
                           "model family, or drafter 'cross-tokenizer', which re-tokenizes the draft's text")


def _new_trace(options: DecodeOptions, target: LanguageModel, draft: LanguageModel | None, prompt,
               prompt_ids: list[int]) -> Trace:
    models = {"target": _describe(target), "draft": _describe(draft) if draft is not None else None}
    return Trace(method=options.method, label=label(options), options=options.to_dict(), models=models,
                 precision=precision_note(target.dtype, kernels.kernels_of(target.model), target.device.type),
                 prompt=prompt if isinstance(prompt, str) else "", prompt_ids=list(prompt_ids))


def _describe(model: LanguageModel) -> dict:
    return {"name": model.name, "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device),
            "source": model.source, "kernels": kernels.kernels_of(model.model)}


def label(options: DecodeOptions) -> str:
    """Human label used in the UI and the benchmark tables."""
    if registry.method(options.method).family == Family.BEAM:
        return beam_run.label(options)
    return registry.label(options)


def precision_note(dtype: torch.dtype, kernel_kind: str = kernels.STOCK, device_type: str = "cpu") -> str:
    if dtype == torch.float32:
        note = ("float32: the algorithm is exact and greedy output equals the baseline token for token unless two "
                "candidates nearly tie (a verification forward and one-token steps differ by ~1e-4 in the logits; "
                "a compared run names any such rounding flip).")
        if kernel_kind == kernels.PACKED and device_type == "cuda":
            note += (" On this GPU fewer, bigger kernels stand in for transformers' modules (fused RMSNorm, q/k/v "
                     "and gate/up as one matmul each: decoders/runtime/fused.py): the same float32 math in another summation "
                     "order, so logits differ from the stock modules by rounding and a near-tie can differ from a "
                     "stock run.")
        elif kernel_kind == kernels.PACKED:
            note += (" Matmuls use oneDNN-packed weights (same float32 products, another summation order: logits "
                     "differ from stock PyTorch by ~1e-5, so a near-tie can differ from a stock-kernel run).")
        return note
    name = str(dtype).removeprefix("torch.")
    return (f"{name}: verifying many tokens in one forward rounds differently from one-token steps (logits differ by "
            "up to ~1 here), so outputs may differ from the baseline by rounding after a while; float32 keeps them "
            "equal.")
