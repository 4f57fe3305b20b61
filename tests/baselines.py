"""The greedy baseline each exactness test compares with, computed once per (model, EOS ids, prompt).

The equality tests ask for the same baselines hundreds of times (every drafter × rule × prompt × length). Greedy
output for a shorter length is a prefix of the output for a longer one, so the longest run asked for so far answers
every shorter request. The cache holds the model object itself next to its result, so an id() is never reused
for another model while its entry lives.
"""
from __future__ import annotations

from decoders import DecodeOptions, generate
from decoders.runtime import kernels

_RUNS: dict[tuple, tuple[object, list[int], bool]] = {}  # key -> (model, ids, ended at EOS)


def baseline_ids(lm, prompt: list[int], length: int) -> list[int]:
    key = (id(lm.model), kernels.kernels_of(lm.model), tuple(lm.eos_token_ids), tuple(prompt))
    _, ids, ended = _RUNS.get(key, (None, [], False))
    if len(ids) < length and not ended:
        trace = generate(DecodeOptions(max_new_tokens=length), list(prompt), target=lm)
        ids, ended = list(trace.output_ids), trace.stop_reason == "eos"
        _RUNS[key] = (lm.model, ids, ended)
    return ids[:length]
