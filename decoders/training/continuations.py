"""Training text written by the target itself: its greedy replies to real prompts (self-distillation).

A learned drafter is scored on the target's own outputs, and a small target's replies are not ShareGPT's: shorter
sentences, its own phrasings, repeated lines, code in its own layout. Featurizing a fixed dataset costs one parallel
forward per sequence; a reply costs one target step per token, so here rows are answered B at a time (one batched
step serves B rows) and the prompt's tokens are kept out of the loss. The held-out α of the training loop stays on
ShareGPT text (comparable across runs); bench.self_drafters measures α on the target's own replies.
"""
from __future__ import annotations

from itertools import islice
from typing import Callable, Iterable

import torch

from ..eagle.data import Example
from .replies import encode_prompt, write_batch


def greedy_replies(model, prompts: list[list[int]], max_new: int, eos: set[int], pad: int) -> list[list[int]]:
    """Each prompt's greedy reply, up to and including its first end-of-sequence token, B rows per step (the one
    batched writer, decoders/training/replies.py, without keeping its features)."""
    records = write_batch(model, prompts, max_new, eos, pad, stems=[])
    return [r.ids[len(p):].tolist() + [int(r.greedy[-1])] for p, r in zip(prompts, records)]


def generated_examples(model, tokenizer, prompts: Iterable[list[dict]], max_len: int, max_tokens: int,
                       batch: int = 16, min_reply: int = 64, progress: Callable[[int], None] | None = None
                       ) -> list[Example]:
    """(prompt + the target's reply) examples, loss on the reply, until `max_tokens` tokens are collected.

    Prompts longer than max_len − min_reply tokens are skipped, so every reply has room for min_reply tokens."""
    eos = {t for t in _as_list(model.generation_config.eos_token_id) + [tokenizer.eos_token_id] if t is not None}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    fitting = (ids for ids in (encode_prompt(tokenizer, m) for m in prompts) if len(ids) <= max_len - min_reply)
    examples, total = [], 0
    batches: list[list[list[int]]] = []
    while total < max_tokens:
        if not batches:  # 4 batches at a time, grouped by prompt length: short prompts leave their rows more room
            pool = sorted(islice(fitting, 4 * batch), key=len)
            batches = [pool[i: i + batch] for i in range(0, len(pool), batch)]
            if not batches:
                break
        encoded = batches.pop(0)
        room = max_len - max(map(len, encoded))
        for ids, reply in zip(encoded, greedy_replies(model, encoded, room, eos, pad)):
            if not reply:
                continue
            examples.append(Example(torch.tensor(ids + reply, dtype=torch.long),
                                    torch.tensor([False] * len(ids) + [True] * len(reply), dtype=torch.bool)))
            total += len(ids) + len(reply)
            if progress:
                progress(len(ids) + len(reply))
    return examples


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]
