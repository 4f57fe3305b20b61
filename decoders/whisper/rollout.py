"""Greedy lookahead rollouts that leave the decoding task's kv-cache alone.

The trap (found by testing against openai-whisper 20250625's decoding.py and model.py): while DecodingTask._main_loop runs, its cache hooks sit on every
decoder key/value Linear. ANY other decoder forward (even one without a kv_cache) fires them, appends the
rollout's keys/values to the task's cache and returns the concatenation: the rollout and the real search are
both silently wrong. So: remove the task's hooks, run the rollout with a cache of our own, put the hooks back.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F


@contextmanager
def task_cache_detached(inference, model):
    """Take the task's kv-cache hooks off the model for the duration; re-attach them to the same cache after."""
    for hook in inference.hooks:
        hook.remove()
    try:
        yield
    finally:
        inference.kv_cache, inference.hooks = model.install_kv_cache_hooks(inference.kv_cache)


def greedy_rollout(task, audio_features: torch.Tensor, sequences: torch.Tensor, depth: int,
                   protect_task_cache: bool = True) -> torch.Tensor:
    """Log-probs of `depth` greedy steps after each sequence, with the task's logit filters applied.

    sequences: (n, L) full token rows (prefix included). Returns (n, depth) float32; NaN after a rollout hit EOT.
    protect_task_cache=False reproduces the bug (tests use it to show the cache test can fail).
    """
    model = task.model
    detach = task_cache_detached(task.inference, model) if protect_task_cache else _nothing()
    with detach:
        cache = _seeded_cache(task.inference.kv_cache, model, sequences, audio_features.dtype)
        cache, hooks = model.install_kv_cache_hooks(cache)
        try:
            return _roll(task, model, audio_features, sequences, depth, cache)
        finally:
            for hook in hooks:
                hook.remove()


def _roll(task, model, audio_features, sequences, depth, cache) -> torch.Tensor:
    eot = task.tokenizer.eot
    tokens = sequences                                                       # (n, L)
    alive = torch.ones(len(tokens), dtype=torch.bool)                        # (n,)
    steps = []
    for d in range(depth):
        fed = tokens if d == 0 else tokens[:, -1:]                           # the cache holds the rest
        logits = model.decoder(fed, audio_features, kv_cache=cache)[:, -1]   # (n, V)
        for logit_filter in task.logit_filters:                              # the search sees filtered logits too
            logit_filter.apply(logits, tokens)
        logprobs = F.log_softmax(logits.float(), dim=-1)                     # (n, V)
        best = logprobs.argmax(dim=-1)                                       # (n,)
        step = logprobs.gather(1, best[:, None])[:, 0]                       # (n,)
        steps.append(torch.where(alive, step, torch.full_like(step, float("nan"))))
        alive &= best != eot
        tokens = torch.cat([tokens, best[:, None]], dim=1)                   # (n, L + d + 1)
    return torch.stack(steps, dim=1)                                         # (n, depth)


def _seeded_cache(task_cache: dict, model, sequences: torch.Tensor, dtype) -> dict:
    """A fresh cache that reuses the task's cross-attention K/V (the audio's, identical for every rollout).

    Self-attention entries come first, empty: TextDecoder reads its position offset from the cache's FIRST
    value, which must be a self-attention entry (0 rows now), not the 1500-row cross-attention one.
    """
    blocks = model.decoder.blocks
    empty = torch.zeros(len(sequences), 0, model.dims.n_text_state, dtype=dtype)  # (n, 0, d)
    cache = {m: empty for block in blocks for m in (block.attn.key, block.attn.value)}
    cross = [m for block in blocks for m in (block.cross_attn.key, block.cross_attn.value)]
    cache.update({m: task_cache[m] for m in cross if m in task_cache})
    return cache


@contextmanager
def _nothing():
    yield
