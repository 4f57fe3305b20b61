"""Greedy losslessness: every method x drafter x rule reproduces the baseline token for token (float32).

The baseline itself is checked against transformers' own greedy `generate`, so the reference is independent.
Drafts: the target itself (everything accepted), a noisy copy (some accepted), an unrelated model (little).
"""
from __future__ import annotations

import pytest
import torch

from baselines import baseline_ids
from decoders import DecodeOptions, generate

PROMPTS = [[7], [3, 9, 4, 1, 7, 22, 5], [10, 11, 12, 10, 11, 12, 10, 11]]  # the last one repeats: lookup matches
LENGTHS = [1, 7, 40]

RULES = [("static", 1), ("static", 3), ("static", 5), ("heuristic", 2), ("max-confidence", 4), ("adaedl", 4)]
CASES = ([("draft-model", kind, rule, gamma) for kind in ("same", "noisy", "unrelated") for rule, gamma in RULES]
         + [("prompt-lookup", None, "static", 4), ("prompt-lookup", None, "heuristic", 2)]
         + [("layer-skip", None, rule, gamma) for rule, gamma in RULES[1:]])


def hf_greedy(lm, prompt, length) -> list[int]:
    eos = list(lm.eos_token_ids) or None
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt], device=lm.device), max_new_tokens=length, do_sample=False,
                                eos_token_id=eos, pad_token_id=0,
                                attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=lm.device))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("length", LENGTHS)
def test_baseline_equals_transformers_greedy(tiny, length):
    for prompt in PROMPTS:
        assert baseline_ids(tiny, prompt, length) == hf_greedy(tiny, prompt, length)


@pytest.mark.parametrize("drafter,kind,rule,gamma", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_speculative_greedy_equals_baseline(tiny, drafts, drafter, kind, rule, gamma):
    draft = drafts[kind] if kind else None
    for prompt in PROMPTS:
        for length in LENGTHS:
            options = DecodeOptions(method="speculative", drafter=drafter, rule=rule, gamma=gamma, max_draft=6,
                                    max_new_tokens=length)
            trace = generate(options, prompt, target=tiny, draft=draft)
            assert trace.output_ids == baseline_ids(tiny, prompt, length), (prompt, length)
            assert len(trace.output_ids) == length  # max_new_tokens honoured exactly


def test_draft_equal_to_target_accepts_everything(tiny):
    options = DecodeOptions(method="speculative", rule="static", gamma=3, max_new_tokens=40)
    trace = generate(options, PROMPTS[1], target=tiny, draft=tiny)
    assert trace.totals["acceptance_rate"] == 1.0
    assert all(len(r.committed) == 4 for r in trace.rounds[:-1])  # γ + 1 tokens per round


@pytest.mark.parametrize("drafter", ["draft-model", "prompt-lookup", "layer-skip"])
def test_eos_is_honoured_exactly(tiny, drafts, drafter):
    prompt = PROMPTS[2]
    free = baseline_ids(tiny, prompt, 30)
    eos = free[9]  # a token the baseline emits at position 10
    stop_at = free.index(eos)
    lm = tiny.with_eos(eos)
    expected = baseline_ids(lm, prompt, 30)
    assert expected == free[: stop_at + 1] == hf_greedy(lm, prompt, 30)
    options = DecodeOptions(method="speculative", drafter=drafter, rule="static", gamma=5, max_new_tokens=30)
    draft = drafts["same"].with_eos(eos) if drafter == "draft-model" else None
    trace = generate(options, prompt, target=lm, draft=draft)
    assert trace.output_ids == expected and trace.stop_reason == "eos"


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_other_architectures(family):
    """Qwen2 (the real pair's architecture) and Gemma3 (sliding-window layers, generation runs past the window)."""
    from tiny import noisy_copy, tiny_gemma3, tiny_qwen2

    lm = tiny_qwen2() if family == "qwen2" else tiny_gemma3()
    draft = noisy_copy(lm, noise=0.02)
    for prompt in PROMPTS[1:]:
        expected = baseline_ids(lm, prompt, 24)
        assert expected == hf_greedy(lm, prompt, 24)
        for drafter, rule in [("draft-model", "adaedl"), ("draft-model", "static"), ("layer-skip", "heuristic"),
                              ("prompt-lookup", "static")]:
            options = DecodeOptions(method="speculative", drafter=drafter, rule=rule, max_new_tokens=24)
            trace = generate(options, prompt, target=lm, draft=draft if drafter == "draft-model" else None)
            assert trace.output_ids == expected, (family, drafter, rule, prompt)
