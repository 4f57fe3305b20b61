"""Sampled outputs follow the target distribution: the joint law of the first two generated tokens, estimated
over many seeds, is compared with exact enumeration from the target (vocabulary of 6, so 36 cells).

Test: Pearson chi-square over the cells (cells expected < 5 pooled); we require p-value > 1e-3. Seeds are fixed,
so the outcome is deterministic. The same test with a wrong residual must give p-value < 1e-3 (checked below).
"""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, generate
from decoders import verify as core
from decoders.sampling import Warp

VOCAB = 6
RUNS = 2000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats, so prompt lookup finds matches


@pytest.fixture(scope="module")
def small():
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(vocab=VOCAB, seed=3, layers=3, scale=0.5)
    return {"target": target, "noisy": noisy_copy(target, noise=0.3), "unrelated": tiny_llama(vocab=VOCAB, seed=11)}


def exact_joint(lm, warp: Warp) -> torch.Tensor:
    """P(x1, x2 | prompt) under the warped target, shape (V, V)."""
    with torch.inference_mode():
        first = warp.probs(lm.model(torch.tensor([PROMPT])).logits[0, -1])  # (V,)
        batch = torch.tensor([PROMPT + [x] for x in range(VOCAB)])  # (V, T+1)
        second = warp.probs(lm.model(batch).logits[:, -1])  # (V, V)
    return first[:, None] * second  # (V, V)


def sampled_joint(options: DecodeOptions, lm, draft) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(RUNS):
        trace = generate(DecodeOptions(**{**options.__dict__, "seed": seed, "record": False}), PROMPT, target=lm,
                         draft=draft)
        x1, x2 = trace.output_ids[:2]
        counts[x1, x2] += 1
    return counts


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    observed, expected = counts.flatten().double(), probs.flatten().double() * counts.sum().double()
    small = expected < 5
    if small.any():  # pool sparse cells so the chi-square approximation holds
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    statistic = (((observed - expected) ** 2)[keep] / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), statistic / 2))


CASES = {
    "draft model, static γ=1": dict(drafter="draft-model", rule="static", gamma=1),
    "draft model, static γ=3": dict(drafter="draft-model", rule="static", gamma=3),
    "draft model, AdaEDL": dict(drafter="draft-model", rule="adaedl", max_draft=4),
    "draft model, γ=2, T=0.8 top-k 4 top-p 0.9": dict(drafter="draft-model", rule="static", gamma=2,
                                                       temperature=0.8, top_k=4, top_p=0.9),
    "prompt lookup (deterministic drafts)": dict(drafter="prompt-lookup", rule="static", gamma=3),
    "layer skip, γ=2": dict(drafter="layer-skip", rule="static", gamma=2, skip_layers=(1,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_first_two_tokens_follow_the_target(small, name):
    settings = {"temperature": 1.0, **CASES[name]}
    options = DecodeOptions(method="speculative", max_new_tokens=2, **settings)
    warp = Warp(options.temperature, options.top_k, options.top_p)
    draft = small["noisy"] if options.drafter == "draft-model" else None
    pvalue = chi_square_pvalue(sampled_joint(options, small["target"], draft), exact_joint(small["target"], warp))
    assert pvalue > 1e-3, f"{name}: sampled joint differs from the target's (chi-square p = {pvalue:.2e})"


def test_baseline_sampling_follows_the_target(small):
    options = DecodeOptions(max_new_tokens=2, temperature=1.0)
    pvalue = chi_square_pvalue(sampled_joint(options, small["target"], None), exact_joint(small["target"], Warp(1.0)))
    assert pvalue > 1e-3


def test_the_statistical_test_catches_a_wrong_residual(small, monkeypatch):
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    options = DecodeOptions(method="speculative", drafter="draft-model", rule="static", gamma=2, temperature=1.0,
                            max_new_tokens=2)
    counts = sampled_joint(options, small["target"], small["unrelated"])
    assert chi_square_pvalue(counts, exact_joint(small["target"], Warp(1.0))) < 1e-3
