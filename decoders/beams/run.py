"""Options in, a live BeamTrace out: the beam methods behind decoders.api.stream (which loads the models)."""
from __future__ import annotations

from typing import Callable, Iterator

from ..runtime.cache import new_cache
from ..clock import DecodeClock
from ..options import DecodeOptions, OptionsError
from ..sampling import Warp, seeded_generator
from .dsbd import DsbdSettings, iter_dsbd
from .search import BeamResult, iter_beam_sampling, iter_beam_search
from .trace import BeamTrace

_EARLY = {"false": False, "true": True, "never": "never"}


def label(options: DecodeOptions) -> str:
    """Human label for the UI and the benchmark tables."""
    if options.method == "beam-search":
        return f"beam search · width {options.width}"
    if options.method == "beam-sampling":
        return f"beam sampling · width {options.width}"
    memory = " · one input beam" if options.one_input_beam else ""
    return f"DSBD · W={options.width} γ={options.gamma} thres={options.thres}{memory}"


def stream_beams(options: DecodeOptions, target, draft, prompt_ids: list[int], trace: BeamTrace) -> Iterator[BeamTrace]:
    """Run the chosen beam method, filling `trace` after every iteration; yields the same live object."""
    vocab = target.model.config.vocab_size
    if options.method == "beam-search" and 2 * options.width > vocab:
        raise OptionsError(f"beam search keeps the best 2·width of {vocab} tokens; lower width to {vocab // 2}")
    if options.method == "dsbd" and _has_sliding_layers(target.model):
        raise OptionsError(f"DSBD scores its draft forest with a custom attention mask, which {target.name}'s "
                           "sliding-window layers do not take; use beam-sampling with this model, or DSBD with a "
                           "model without sliding-window attention (smollm2, qwen2.5-coder)")
    clock = DecodeClock(next(target.model.parameters()).device)  # the chains' clock: decoders/clock.py says what it counts
    steps = _steps(options, target, draft, prompt_ids, clock)  # each method marks clock.prefill_done() after prefill
    seen = 0
    try:
        for result in steps:
            for step in result.steps[seen:]:
                trace.iterations.append(_iteration(len(trace.iterations), step, options, target.decode))
            seen = len(result.steps)
            trace.prefill_seconds = (clock.prefill_end or clock.start) - clock.start
            trace.decode_seconds = clock.total()
            if result.stop_reason:
                _finish(trace, result, target.decode)
            _totals(trace, result)
            with clock.paused():  # the consumer's time (rendering, a slow client) is not decode time
                yield trace
    finally:
        steps.close()  # now, in this thread: the method's caches go at once, not whenever (or wherever) GC runs
        if not trace.stop_reason:
            trace.stop_reason = "cancelled"  # closed early (Stop): the caches were locals of the closed generator


def _has_sliding_layers(model) -> bool:
    return any(getattr(layer, "is_sliding", False) for layer in new_cache(model).layers)


def _steps(options: DecodeOptions, target, draft, prompt_ids: list[int], clock: DecodeClock) -> Iterator[BeamResult]:
    eos = set(target.eos_token_ids)
    if options.method == "beam-search":
        return iter_beam_search(target.model, prompt_ids, options.width, options.max_new_tokens, eos,
                                options.length_penalty, _EARLY[options.early_stopping], clock=clock)
    generator = seeded_generator(next(target.model.parameters()).device, options.seed)
    warp = Warp(options.temperature, options.top_k, options.top_p)
    if options.method == "beam-sampling":
        return iter_beam_sampling(target.model, prompt_ids, options.width, options.max_new_tokens, eos, warp,
                                  generator, clock=clock)
    settings = DsbdSettings(options.gamma, options.width, options.min_width, options.thres, options.one_input_beam)
    return iter_dsbd(target.model, draft.model, prompt_ids, settings, options.max_new_tokens, eos, warp, generator,
                     clock=clock)


def _iteration(index: int, step: dict, options: DecodeOptions, decode: Callable[[list[int]], str]) -> dict:
    """One step of any beam method in the trace's Iteration shape (beam search/sampling: a one-layer forest)."""
    if "nodes" in step:  # DSBD already records its forest
        nodes = [{**node, "text": decode([node["token"]])} for node in step["nodes"]] if options.record else []
        return {"index": index, "nodes": nodes, "layers": step["layers"], "stopped_at": step["stopped_at"],
                "beams": step["beams"], "ended": step["ended"], "finished": _pairs(step["finished"]), "kv_bytes": step["kv_bytes"],
                "target_rows": step["target_rows"], "target_forwards": 1, "draft_forwards": step["draft_forwards"]}
    n_roots = max(step["parents"]) + 1
    nodes = [{"id": i, "row": i, "layer": 0, "token": None, "text": "", "parent": -1, "q": None, "p": None,
              "status": "root", "u": None, "accept_prob": None} for i in range(n_roots)]
    logps = step.get("logps", [None] * len(step["tokens"]))
    for j, (parent, token, score) in enumerate(zip(step["parents"], step["tokens"], step["scores"])):
        nodes.append({"id": n_roots + j, "row": parent, "layer": 1, "token": token, "text": decode([token]),
                      "parent": parent, "q": None, "p": None, "status": "accepted", "u": None, "accept_prob": None,
                      "score": score, "logp": logps[j]})
    live = step.get("live", list(range(len(step["tokens"]))))
    beams = [{"row": step["parents"][j], "tokens": [step["tokens"][j]], "score": step["scores"][j],
              "logp": logps[j]} for j in live]
    return {"index": index, "nodes": nodes if options.record else [], "layers": [], "stopped_at": None,
            "beams": beams, "finished": _pairs(step.get("finished", [])),
            "kv_bytes": {"target": step["kv_bytes"], "draft": 0},
            "target_rows": len(beams), "target_forwards": 1, "draft_forwards": 0}


def _pairs(finished: list) -> list[list]:
    """[tokens, score] lists, as JSON gives them back (the round trip compares equal)."""
    return [[list(tokens), float(score)] for tokens, score in finished]


def _finish(trace: BeamTrace, result: BeamResult, decode: Callable[[list[int]], str]) -> None:
    trace.stop_reason = result.stop_reason
    trace.output_ids = list(result.tokens)
    trace.output_text = decode(trace.output_ids)
    trace.candidates = [{"tokens": c.tokens, "text": decode(c.tokens), "score": c.score, "logp": c.logp}
                        for c in result.candidates]


def _totals(trace: BeamTrace, result: BeamResult) -> None:
    draft_forwards = sum(it["draft_forwards"] for it in trace.iterations)
    seconds = trace.decode_seconds
    tokens = len(trace.output_ids)
    trace.totals = {"tokens": tokens, "iterations": len(trace.iterations), "target_forwards": result.target_forwards,
                    "draft_forwards": draft_forwards, "peak_kv_bytes": result.peak_kv_bytes,
                    "tokens_per_second": tokens / seconds if seconds > 0 and tokens else None}


def new_trace(options: DecodeOptions, models: dict, prompt, prompt_ids: list[int]) -> BeamTrace:
    return BeamTrace(method=options.method, label=label(options), options=options.to_dict(), models=models,
                     prompt=prompt if isinstance(prompt, str) else "", prompt_ids=list(prompt_ids))


