"""The peers: Hugging Face transformers' own `generate`, timed exactly like SpecLab's runs.

Three peers, same models, same prompt ids, same max_new_tokens, greedy:
  hf/greedy          model.generate(do_sample=False)
  hf/assisted        model.generate(assistant_model=draft, do_sample=False) with the assistant settings given per
                     method (num_assistant_tokens, assistant_confidence_threshold, num_assistant_tokens_schedule;
                     bench/tuning.py picks them on tuning prompts). They are written into the draft's
                     generation_config for the call and restored after it, so a "heuristic" schedule starts from the
                     same value in every run (transformers would otherwise carry its state into the next call).
  hf/early-exit      model.generate(assistant_early_exit=k, do_sample=False): LayerSkip's self-speculation, the
                     target's first k layers and its LM head as the draft (untrained for early exit here)
  hf/prompt-lookup   model.generate(prompt_lookup_num_tokens=N, max_matching_ngram_size=n, do_sample=False): the
                     bench passes SpecLab's n-gram size, so both sides match the same n-grams (n..1, first from left).

Timing (the same clock as SpecLab's runs, see bench/runner.py): a streamer notes the wall time of every batch of
new tokens. Decode time runs from the first batch of new tokens (the end of prefill and of the first round) to the
return of `generate`; decode tokens are the tokens delivered after that first batch. Target and draft forward
calls are counted with forward pre-hooks, so τ and the drafted-token count come from the model calls themselves:
τ = new tokens ÷ target forward calls, the prefill call included (HF's first call is prefill and first round).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

# transformers' own defaults, used where a method gives no setting
ASSISTED_DEFAULTS = {"num_assistant_tokens": 20, "assistant_confidence_threshold": 0.4,
                     "num_assistant_tokens_schedule": "constant"}
PROMPT_LOOKUP_DEFAULTS = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2}


@dataclass
class _TimingStreamer:
    """transformers streamer protocol: put(prompt) once, then put(new tokens) per step/round, then end()."""

    saw_prompt: bool = False
    events: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter, tokens delivered)

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self.saw_prompt:
            self.saw_prompt = True
            return
        self.events.append((now, int(value.numel())))

    def end(self) -> None:
        pass


class _CallCounter:
    """Counts forward calls of a model and the number of new input tokens of each call."""

    def __init__(self, model: torch.nn.Module):
        self.sizes: list[int] = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        self.sizes.append(int(ids.shape[-1]) if ids is not None else 0)

    def close(self) -> None:
        self.handle.remove()


def peer_settings(kind: str, settings: dict | None = None) -> dict:
    """What the peer runs with (transformers' defaults overridden by `settings`), for the JSON and the report."""
    import transformers

    try:
        import sklearn  # noqa: F401

        sklearn_ok = True
    except ImportError:
        sklearn_ok = False
    out = {"transformers": transformers.__version__, "do_sample": False, "num_beams": 1}
    if kind == "assisted":
        out.update(_merged(ASSISTED_DEFAULTS, settings))
        out["confidence_threshold_adapts"] = sklearn_ok  # transformers tunes it by ROC only with scikit-learn
        out["schedule_state"] = "reset before every call"
    elif kind == "prompt-lookup":
        out.update(_merged(PROMPT_LOOKUP_DEFAULTS, settings))
    return out


def _merged(defaults: dict, settings: dict | None) -> dict:
    unknown = set(settings or {}) - set(defaults)
    if unknown:
        raise ValueError(f"unknown HF setting(s) {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **(settings or {})}


@contextmanager
def assistant_config(draft_model: torch.nn.Module, settings: dict):
    """The assistant's generation_config carries transformers' assisted settings: set them for one call, then
    restore them (the "heuristic" schedule writes its last draft length back into that config)."""
    config = draft_model.generation_config
    saved = {name: getattr(config, name, None) for name in settings}
    try:
        for name, value in settings.items():
            setattr(config, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


@torch.inference_mode()
def run_peer(kind: str, target, prompt_ids: list[int], max_new_tokens: int, draft=None,
             settings: dict | None = None, temperature: float = 0.0, seed: int = 0) -> dict:
    """One HF generate call. kind: "greedy" | "assisted" | "prompt-lookup" (greedy = plain decoding, sampled when
    temperature > 0: transformers' assisted generation then verifies by speculative sampling). Raw figures back."""
    model = target.model
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)  # (1, P)
    eos = list(target.eos_token_ids) or None
    sampled = temperature > 0
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                  do_sample=sampled, temperature=temperature if sampled else None, top_p=None, top_k=None,
                  num_beams=1, eos_token_id=eos, pad_token_id=(eos[0] if eos else 0))
    if sampled:
        torch.manual_seed(seed)  # transformers draws from the global generator
    assisted = {}
    if kind == "assisted":
        if draft is None:
            raise ValueError("hf/assisted needs a draft model")
        kwargs["assistant_model"] = draft.model
        assisted = _merged(ASSISTED_DEFAULTS, settings)
    elif kind == "prompt-lookup":
        kwargs.update(_merged(PROMPT_LOOKUP_DEFAULTS, settings))
    elif kind == "early-exit":  # LayerSkip: the target's first k layers + its own LM head draft (one model object)
        assisted = _merged({**ASSISTED_DEFAULTS, "assistant_early_exit": 4}, settings)
        kwargs["assistant_early_exit"] = assisted.pop("assistant_early_exit")
        draft = target  # the assistant is the target itself: its generation_config carries the assisted settings
    elif kind != "greedy":
        raise ValueError(f"unknown peer {kind!r}")
    streamer = _TimingStreamer()
    target_calls = _CallCounter(model)
    draft_calls = _CallCounter(draft.model) if kind == "assisted" else None
    try:
        with assistant_config(draft.model, assisted) if assisted else _nothing():
            start = time.perf_counter()
            out = model.generate(**kwargs, streamer=streamer)
            if device.type == "cuda":
                torch.cuda.synchronize()
            end = time.perf_counter()
    finally:
        target_calls.close()
        if draft_calls is not None:
            draft_calls.close()
    output = out[0, len(prompt_ids):].tolist()
    result = _figures(output, streamer.events, start, end, target_calls.sizes,
                      draft_calls.sizes if draft_calls else [], len(prompt_ids), kind)
    result["target_call_sizes"] = list(target_calls.sizes)
    if kind == "early-exit":  # draft and verification calls hit the same model object: τ cannot be read from calls
        result.update(tau=None, drafted=None, accepted=None, acceptance_rate=None)
    return result


@contextmanager
def _nothing():
    yield


def _figures(output: list[int], events: list[tuple[float, int]], start: float, end: float, target_sizes: list[int],
             draft_sizes: list[int], prompt_len: int, kind: str) -> dict:
    first_time, first_tokens = events[0] if events else (end, len(output))
    decode_tokens = len(output) - first_tokens
    decode_seconds = end - first_time
    rounds = len(target_sizes)
    if kind == "greedy":
        drafted = 0
    else:  # first call: prompt + candidates; later calls: the pending token + candidates
        drafted = sum(max(0, n - 1) for n in target_sizes[1:]) + (max(0, target_sizes[0] - prompt_len) if rounds else 0)
    accepted = max(0, len(output) - rounds)
    return {
        "output_ids": output,
        "n_tokens": len(output),
        "decode_tokens": decode_tokens,
        "decode_seconds": decode_seconds,
        "tok_s": decode_tokens / decode_seconds if decode_tokens > 0 and decode_seconds > 0 else None,
        "prefill_seconds": first_time - start,  # prefill + the first step/round (HF does both in one call)
        "wall_seconds": end - start,
        "target_forwards": rounds,  # every call, the prefill call included (it also verifies the first drafts)
        "draft_forwards": len(draft_sizes),
        "tau": len(output) / rounds if rounds else None,  # prefill call counted: the same rule as SpecLab's rows
        "drafted": drafted,
        "accepted": accepted if drafted else 0,
        "acceptance_rate": min(1.0, accepted / drafted) if drafted else None,
        "rounds_first_tokens": first_tokens,
    }
