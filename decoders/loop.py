"""The one generation loop. Every chain method is this loop with a different drafter and draft-length rule;
the autoregressive baseline is the same loop with a drafter that never drafts.

It is a generator that yields the live trace after every round (streaming is the only mode; `api.generate`
drains it), and, while a prompt longer than one prefill chunk is read, between two chunks (trace.prefill says how
far; no round yet). Closing the generator early (a Stop button) runs the `finally` that frees every cache.
"""
from __future__ import annotations

import functools
from typing import Iterator

import torch

from .clock import DecodeClock
from .drafters import Drafter
from .readout import read_round
from .recorder import TraceBuilder
from .rules import DraftRule
from .runtime.runner import CachedModel
from .sampling import Warp
from .trace import Trace
from .verify import verify, walk_on_device


def run_rounds(target: CachedModel, drafter: Drafter, rule: DraftRule | None, warp: Warp, prompt_ids: list[int],
               max_new_tokens: int, eos_ids: set[int], generator: torch.Generator,
               builder: TraceBuilder) -> Iterator[Trace]:
    """Decode until EOS or max_new_tokens, yielding the trace after every round."""
    ids = list(prompt_ids)
    clock = DecodeClock(target.device)  # what decode time includes: decoders/clock.py
    stop_reason = "cancelled"
    try:
        for reading in _read_prompt(target, drafter, ids, builder):
            with clock.paused():  # a long prompt is read in chunks: the run can be closed (Stop) between two
                yield reading
        builder.trace.prefill_seconds = clock.prefill_done()
        produced = 0
        while produced < max_new_tokens:
            # 1. propose: at most budget - 1 drafts, so accepted drafts + the target's token never overshoot
            limit = min(rule.limit() if rule else 0, max_new_tokens - produced - 1)
            # laps: on CUDA, events read out after the round's one copy (decoders/clock.py); float(lap) is seconds
            t_before = clock.lap()  # the previous round's recording and this limit(): bookkeeping, not drafting
            proposal = drafter.propose(ids, limit, rule, warp, generator, builder.record)
            t_draft = clock.lap()  # drafting alone: what the controller's draft cost c is timed from
            # 2. score every node in one target forward; 3. verify (the one verification core)
            tree = proposal.tree
            # logits (N+1, V); features (N+1, H) from the same forward when the drafter wants them, else None
            logits, features = drafter.score(target, tree, drafter.wants_target_hidden)
            p = None if warp.greedy else warp.probs(logits)  # (N+1, V), None at temperature 0
            # sampled: the rejection-sampling walk as device tensors (4N+1,), its numbers read with the copy below
            walk = None if p is None else walk_on_device(tree, p, generator)
            # the round's one device-to-host copy; on CUDA its wait also settles the clock's laps so far
            readout = read_round(tree, logits, p, builder.record, walk, clock)
            verdict = verify(tree, logits, p, generator, readout)
            t_verify = clock.lap()
            # 4. commit the accepted path and the target's own token, nothing after an end-of-sequence token
            committed, hit_eos = _cut_at_eos([tree.tokens[n] for n in verdict.path] + [verdict.token], eos_ids)
            target.keep_path(tree.size, [0] + verdict.path)
            n_before = len(ids)
            ids += committed
            produced += len(committed)
            # 5. let the drafter roll back and the rule learn
            drafter.observe(n_before, verdict.n_accepted, path=verdict.path, features=features)
            if rule:
                rule.observe_time(float(t_draft), proposal.forwards, float(t_verify), tree.size)
            rule_after = rule.update(verdict.n_accepted, tree.n_drafted) if rule else {}
            seconds = {"draft": float(t_draft), "verify": float(t_verify),
                       "bookkeeping": float(t_before) + float(clock.lap())}
            # 6. record (its own time is counted in the next round's bookkeeping, or after the last round)
            builder.add_round(proposal, verdict, committed, readout, rule_after, rule.name if rule else None,
                              limit, seconds)
            builder.trace.decode_seconds = clock.total()
            with clock.paused():  # the consumer's time (rendering, a slow client) is not decode time
                yield builder.trace
            if hit_eos:
                stop_reason = "eos"
                break
        else:
            stop_reason = "max_new_tokens"
    finally:
        try:
            _finish(builder, clock, stop_reason, target, drafter)
        finally:  # each release runs even when what came before it raised (a later error has the earlier as context)
            try:
                drafter.close()
            finally:
                target.release()


def _finish(builder: TraceBuilder, clock: DecodeClock, stop_reason: str, target: CachedModel,
            drafter: Drafter) -> None:
    """The trace's last figures: decode time, stop reason, KV peaks, the drafter's summary, the runtime."""
    builder.trace.decode_seconds = clock.total()
    builder.finish(stop_reason)
    # Each cache's own peak, added: an upper bound on what both held at once (they peak at different moments).
    builder.trace.totals["peak_kv_bytes"] = target.peak_bytes + drafter.kv_peak_bytes()
    builder.trace.totals.update(drafter.summary())
    builder.trace.runtime = runtime(target, drafter)


def runtime(target: CachedModel, drafter: Drafter) -> dict:
    """Trace.runtime: the machine, and how each model's KV cache was kept and its forwards ran (graph or eager)."""
    return {"machine": _machine(str(target.device)), "device": str(target.device), "target": target.runtime(),
            **drafter.runtime()}


@functools.lru_cache(maxsize=None)
def _machine(device: str) -> str:
    """The device's description (CPU model and threads, or GPU name), read once per process."""
    from .costs import machine_description

    return machine_description(torch.device(device))


def _read_prompt(target: CachedModel, drafter: Drafter, ids: list[int], builder: TraceBuilder) -> Iterator[Trace]:
    """The prefill: the target reads the prompt (all but the pending last token) in chunks, then the drafter its own
    way (a draft model in chunks too). Between two chunks it yields the live trace with trace.prefill saying how far
    it got, so closing the run lands within one chunk; a prompt that fits one chunk yields nothing."""
    context = ids[:-1]
    hidden = drafter.wants_target_hidden  # an EAGLE head drafts from the prompt's features: keep them
    features = []  # per chunk (n, H)
    for read, states in target.prefill(context, hidden=hidden):
        features.append(states)
        if read < len(context):
            yield _reading(builder, "target", read, len(context))
    if hidden:
        steps = drafter.start_steps(ids, features=torch.cat(features) if features else None)  # (len(ids) - 1, H)
    else:
        steps = drafter.start_steps(ids)
    for read in steps:
        if read < len(context):
            yield _reading(builder, "draft", read, len(context))
    builder.trace.prefill = None


def _reading(builder: TraceBuilder, model: str, read: int, total: int) -> Trace:
    builder.trace.prefill = {"model": model, "read": read, "of": total}
    return builder.trace


def _cut_at_eos(tokens: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1], True
    return tokens, False
