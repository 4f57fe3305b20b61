"""int8 drafts (decoders/runtime/kernels.py quantize_int8, decoders/quantize.py): only q changes, so every method stays
lossless, and "auto" turns int8 on only where this machine measured it faster."""
from __future__ import annotations

import copy

import pytest
import torch

from decoders import DecodeOptions, OptionsError, generate, quantize
from decoders.runtime import kernels
from decoders.runtime.residency import model_bytes

PROMPTS = [[3, 9, 4, 1, 7, 22, 5], [10, 11, 12, 10, 11, 12, 10, 11]]


def int8_copy(lm):
    draft = copy.deepcopy(lm)
    assert kernels.quantize_int8(draft.model) > 0
    return draft


def test_int8_linears_are_counted_and_named(drafts):
    draft = int8_copy(drafts["noisy"])
    assert kernels.kernels_of(draft.model) == kernels.INT8
    dense = model_bytes(drafts["noisy"].model)
    assert 0.2 * dense < model_bytes(draft.model) < dense  # int8 weights: smaller, but counted


@pytest.mark.parametrize("rule", ["static", "adaedl"])
def test_an_int8_draft_keeps_greedy_equal_to_the_baseline(tiny, drafts, rule):
    draft = int8_copy(drafts["noisy"])
    for prompt in PROMPTS:
        options = DecodeOptions(method="speculative", rule=rule, gamma=4, max_new_tokens=32)
        trace = generate(options, prompt, target=tiny, draft=draft)
        assert trace.output_ids == generate(DecodeOptions(max_new_tokens=32), prompt, target=tiny).output_ids
        assert trace.totals["drafted"] > 0


def test_auto_picks_int8_only_where_measured_faster(monkeypatch):
    from decoders import costs

    class Curve:
        def __init__(self, step):
            self.draft_step_seconds = step

    loaded = {}

    def load(name, quant):
        loaded[quant] = True
        return quant

    timings = {None: 0.10, kernels.INT8: 0.05}
    monkeypatch.setattr(costs, "measure", lambda lm, ns: Curve(timings[lm]))
    assert quantize.resolve("auto", "d", "cpu", load) == kernels.INT8
    timings[kernels.INT8] = 0.095  # within the noise margin: not worth it
    assert quantize.resolve("auto", "d", "cpu", load) is None
    assert quantize.resolve("int8", "d", "cpu", load) == kernels.INT8 and quantize.resolve("none", "d", "cpu", load) is None
    assert quantize.resolve("auto", "d", "cuda", load) is None


def test_draft_quant_is_validated():
    with pytest.raises(OptionsError, match="unknown draft_quant 'int4'"):
        DecodeOptions(method="speculative", draft_quant="int4").validate()


def test_int8_needs_float32_on_the_cpu():
    from decoders.runtime import models
    from decoders.runtime.models import ModelError

    with pytest.raises(ModelError, match="int8 drafts run on the CPU from float32"):
        models.load_model("smollm2-135m", dtype="bfloat16", quant="int8")
