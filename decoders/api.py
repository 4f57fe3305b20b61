"""The Python API: options + prompt in, a streamed or finished Trace out.

    from decoders import DecodeOptions, generate
    trace = generate(DecodeOptions(model="smollm2-135m", method="speculative", drafter="prompt-lookup"),
                     "Repeat after me: the quick brown fox")
    print(trace.output_text, trace.totals["tau"])

`stream(...)` yields the same live Trace after every round (copy it if you need snapshots). Models come from
decoders/models.py unless passed in (tests pass tiny random-init models).
"""
from __future__ import annotations

from typing import Iterator, Protocol

import torch

from . import kernels
from .drafters import DraftModelDrafter, Drafter, LayerSkipDrafter, NoDraft, PromptLookupDrafter
from .loop import run_rounds
from .options import DecodeOptions, OptionsError
from .recorder import TraceBuilder
from .rules import make_rule
from .runner import CachedModel
from .sampling import Warp
from .trace import Trace


class LanguageModel(Protocol):
    """What the decoders need from a loaded model (decoders.models.LoadedModel satisfies it)."""

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
           draft: LanguageModel | None = None) -> Iterator[Trace]:
    """Validate, load what is missing, and decode round by round."""
    options.validate()
    target = target or _load(options.model, options)
    prompt_ids = _prompt_ids(target, prompt, options)
    if options.method == "speculative" and options.drafter == "draft-model":
        draft = draft or _load(draft_for(options), options)
        _check_pair(target, draft)
    runner = CachedModel(target.model)
    drafter = _make_drafter(options, runner, draft, target)
    rule = make_rule(options.rule, options.gamma, options.max_draft, options.lam, options.lam_keep) \
        if options.method == "speculative" else None
    builder = TraceBuilder(_new_trace(options, target, draft, prompt, prompt_ids), target.decode, options.record)
    generator = torch.Generator().manual_seed(options.seed)
    warp = Warp(options.temperature, options.top_k, options.top_p)
    yield from run_rounds(runner, drafter, rule, warp, prompt_ids, options.max_new_tokens,
                          set(target.eos_token_ids), generator, builder)


def generate(options: DecodeOptions, prompt: str | list[int], target: LanguageModel | None = None,
             draft: LanguageModel | None = None) -> Trace:
    """Blocking call: drain `stream` and return the finished trace."""
    trace = None
    for trace in stream(options, prompt, target, draft):
        pass
    if trace is None:  # unreachable: every run has at least one round
        raise RuntimeError("the decoder produced no round")
    return trace


def _prompt_ids(target: LanguageModel, prompt: str | list[int], options: DecodeOptions) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise OptionsError("the prompt is empty; type something for the model to continue")
        ids = target.encode_prompt(prompt, chat=options.chat)
    else:
        ids = list(prompt)
    if not ids:
        raise OptionsError("the prompt encodes to no tokens; type something for the model to continue")
    room = target.context_length - len(ids)
    if options.max_new_tokens > room:
        raise OptionsError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({options.max_new_tokens}) exceeds {target.name}'s context "
            f"of {target.context_length} tokens; shorten the prompt or set max_new_tokens to at most {max(room, 0)}")
    return ids


def _make_drafter(options: DecodeOptions, runner: CachedModel, draft: LanguageModel | None,
                  target: LanguageModel) -> Drafter:
    if options.method == "baseline":
        return NoDraft()
    if options.drafter == "draft-model":
        return DraftModelDrafter(draft.model)
    if options.drafter == "prompt-lookup":
        return PromptLookupDrafter(options.ngram, tuple(target.eos_token_ids))
    try:
        return LayerSkipDrafter(runner, list(options.skip_layers) if options.skip_layers is not None else None)
    except ValueError as err:
        raise OptionsError(str(err)) from None


def draft_for(options: DecodeOptions) -> str | None:
    """The draft model a run needs: None unless the drafter is a draft model; the registry's pairing by default."""
    if options.method != "speculative" or options.drafter != "draft-model":
        return None
    if options.draft_model:
        return options.draft_model
    from . import models  # the registry knows which draft pairs with which target

    entry = models.REGISTRY.get(options.model)
    if entry is None or entry.default_draft is None:
        pairs = [f"{n} (draft {e.default_draft})" for n, e in models.REGISTRY.items() if e.default_draft]
        raise OptionsError(f"{options.model} has no default draft model; pass draft_model=... or pick a target that "
                           f"has one: {', '.join(pairs)}")
    return entry.default_draft


def _load(name: str, options: DecodeOptions) -> LanguageModel:
    from . import models

    return models.load_model(name, dtype=options.dtype, device=options.device)


def _check_pair(target: LanguageModel, draft: LanguageModel) -> None:
    if getattr(target, "tokenizer", None) is not None and getattr(draft, "tokenizer", None) is not None:
        from . import models

        models.check_tokenizers_compatible(target, draft)
    if target.model.config.vocab_size != draft.model.config.vocab_size:
        raise OptionsError(f"draft {draft.name} has a vocabulary of {draft.model.config.vocab_size} tokens but the "
                           f"target {target.name} has {target.model.config.vocab_size}; pick a draft from the same "
                           "model family")


def _new_trace(options: DecodeOptions, target: LanguageModel, draft: LanguageModel | None, prompt,
               prompt_ids: list[int]) -> Trace:
    models = {"target": _describe(target), "draft": _describe(draft) if draft is not None else None}
    return Trace(method=options.method, label=label(options), options=options.to_dict(), models=models,
                 precision=precision_note(target.dtype, kernels.kernels_of(target.model)),
                 prompt=prompt if isinstance(prompt, str) else "", prompt_ids=list(prompt_ids))


def _describe(model: LanguageModel) -> dict:
    return {"name": model.name, "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device),
            "source": model.source, "kernels": kernels.kernels_of(model.model)}


def label(options: DecodeOptions) -> str:
    """Human label used in the UI and the benchmark tables."""
    if options.method == "baseline":
        return "autoregressive baseline"
    rule = {"static": f"static γ={options.gamma}", "heuristic": "HF heuristic", "max-confidence": "max-confidence",
            "adaedl": "AdaEDL"}[options.rule]
    drafter = {"draft-model": "draft model", "prompt-lookup": "prompt lookup", "layer-skip": "layer skip"}
    return f"speculative · {drafter[options.drafter]} · {rule}"


def precision_note(dtype: torch.dtype, kernel_kind: str = kernels.STOCK) -> str:
    if dtype == torch.float32:
        note = "float32: verification is exact; greedy output equals the baseline token for token."
        if kernel_kind == kernels.PACKED:
            note += (" Matmuls use oneDNN-packed weights (same float32 products, another summation order: logits "
                     "differ from stock PyTorch by ~1e-5, so a near-tie can differ from a stock-kernel run).")
        return note
    name = str(dtype).removeprefix("torch.")
    return (f"{name}: verifying many tokens in one forward rounds differently from one-token steps, so outputs can "
            "diverge from plain greedy after a while; lossless only up to numerics (use float32 for exact checks).")
