"""Every difference from the baseline explained (decoders/compare.py): rounding in a low-precision run, a mismatch
for a verifier that accepts what the target did not choose."""
from __future__ import annotations

import copy

import pytest
import torch

from decoders import DecodeOptions, OptionsError, generate, loop
from decoders.compare import RESOLUTION, Comparison, _classify, compare
from decoders.verify import Verdict

PROMPTS = [[7], [3, 9, 4, 1, 7, 22, 5], [10, 11, 12, 10, 11, 12, 10, 11]]


def in_bfloat16(lm):
    from decoders import kernels

    half = copy.deepcopy(lm)
    kernels.unpack(half.model)  # a bench test may have packed the session's models; packed weights stay float32
    half.model = half.model.to(torch.bfloat16)
    half.dtype = torch.bfloat16
    return half


def test_classify_rounding_and_each_kind_of_mismatch():
    near_tie = [[4, 10.0], [9, 9.9999]]  # the baseline chose 4, 9 a hair behind
    run_ranks_9 = [[9, 10.0], [4, 9.99995]]
    assert _classify(3, run_ranks_9, [[4, 10.0], [9, 9.9999]], 9, 4, "bfloat16").kind == "rounding"
    wide = [[4, 12.0], [9, 9.0]]
    assert "wider than bfloat16" in _classify(3, run_ranks_9, wide, 9, 4, "bfloat16").reason
    not_runner_up = [[4, 10.0], [5, 9.99]]
    assert "not even the baseline's second choice" in _classify(3, run_ranks_9, not_runner_up, 9, 4, "bfloat16").reason
    verifier_disagrees = [[4, 10.0], [9, 9.99]]  # the run kept 9 although its own forward ranked 4 first
    assert "did not rank first" in _classify(3, verifier_disagrees, near_tie, 9, 4, "bfloat16").reason
    assert _classify(3, None, near_tie, 9, 4, "float32").kind == "unclassified"  # an old trace without logits


def test_float32_resolution_is_the_measured_noise_not_any_gap():
    gap = 1e-4
    base = [[4, 10.0], [9, 10.0 - gap]]
    run = [[9, 10.0], [4, 10.0 - gap / 2]]
    assert _classify(0, run, base, 9, 4, "float32").kind == "rounding" and gap < RESOLUTION["float32"]
    base_far = [[4, 10.0], [9, 9.99]]
    assert _classify(0, run, base_far, 9, 4, "float32").kind == "mismatch"


def test_lines_say_what_happened():
    assert Comparison(True, "same").line() == "same as baseline"
    rounding = Comparison(False, "rounding", 30, 4, 9, 0.01, 0.005, 2.0, "bfloat16")
    assert rounding.line(("a", "b")).startswith("differs at token 31: rounding (baseline's top-2 gap 0.01 is within "
                                                "bfloat16's ~2")
    mismatch = Comparison(False, "mismatch", 2, 4, 9, 3.0, None, 2.0, "bfloat16", reason="r")
    assert mismatch.line() == "differs at token 3: mismatch (r)"


def test_float32_runs_are_the_same(tiny, drafts):
    for prompt in PROMPTS:
        trace = generate(DecodeOptions(method="speculative", gamma=4, max_new_tokens=40), prompt, target=tiny,
                         draft=drafts["noisy"], compare_baseline=True)
        assert trace.baseline_check["kind"] == "same", trace.baseline_check


def test_a_bfloat16_run_that_diverges_is_rounding(tiny, drafts):
    """Tiny random models in bf16 tie often: several of these runs diverge, and every divergence is rounding."""
    target, draft = in_bfloat16(tiny), in_bfloat16(drafts["noisy"])
    kinds = []
    for prompt in PROMPTS:
        trace = generate(DecodeOptions(method="speculative", gamma=4, max_new_tokens=60), prompt, target=target,
                         draft=draft, compare_baseline=True)
        kinds.append(trace.baseline_check["kind"])
        if trace.baseline_check["kind"] != "same":
            assert trace.baseline_check["gap"] <= RESOLUTION["bfloat16"]
    assert "rounding" in kinds and "mismatch" not in kinds, kinds


def test_a_verifier_that_accepts_a_wrong_draft_is_a_mismatch(tiny, drafts, monkeypatch):
    """The negative control: accept the first draft whatever the target says."""
    real = loop.verify

    def careless(tree, logits, p, generator, argmax=None):
        verdict = real(tree, logits, p, generator, argmax)
        if tree.n_drafted and not verdict.path:
            return Verdict([1], int(logits[1].argmax()), verdict.source, verdict.checks)
        return verdict

    monkeypatch.setattr(loop, "verify", careless)
    trace = generate(DecodeOptions(method="speculative", gamma=3, max_new_tokens=40), PROMPTS[1], target=tiny,
                     draft=drafts["unrelated"], compare_baseline=True)
    assert trace.baseline_check["kind"] == "mismatch", trace.baseline_check
    assert "did not rank first" in trace.baseline_check["reason"]


def test_sampled_runs_are_not_compared_token_for_token(tiny, drafts):
    trace = generate(DecodeOptions(method="speculative", temperature=1.0, max_new_tokens=8), PROMPTS[0], target=tiny,
                     draft=drafts["noisy"], compare_baseline=True)
    assert trace.baseline_check["kind"] == "sampled" and trace.baseline_check["same"] is None


def test_beam_methods_have_no_baseline_check(tiny):
    with pytest.raises(OptionsError, match="no token-for-token baseline check"):
        generate(DecodeOptions(method="beam-search", width=2, max_new_tokens=4), PROMPTS[0], target=tiny,
                 compare_baseline=True)


def test_the_record_survives_json(tiny, drafts):
    from decoders import Trace

    trace = generate(DecodeOptions(method="speculative", max_new_tokens=6, record=False), PROMPTS[1], target=tiny,
                     draft=drafts["noisy"], compare_baseline=True)
    back = Trace.from_json(trace.to_json())
    assert back.baseline_check == trace.baseline_check and back.tokens[0].top2 == trace.tokens[0].top2
    assert compare(back, back).kind == "same"
