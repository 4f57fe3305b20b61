"""Sampled outputs follow the target distribution, with drafts deeper than one token.

Each case decodes the same prompt under RUNS seeds with a budget of 4 new tokens, so the first round may draft
γ = 3 tokens (the loop keeps one token of the budget for the target's own), and compares the joint law of the
first three generated tokens with exact enumeration from the target (vocabulary of 4: 64 cells). The third token
is the depth-3 draft accepted, or what the target resampled or added after it, so every depth is put to the test.
The test reads each trace and asserts the first round really drafted 2 or more tokens.

Test: Pearson chi-square over the cells (cells expected < 5 pooled into one); we require p-value > 1e-3. Seeds
are fixed, so the outcome is deterministic. The same test with a wrong residual (r unchanged, i.e. resampling
from p) must give p-value < 1e-3: checked below, so a passing test means something.
"""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, generate
from decoders import verify as core
from decoders.sampling import Warp

from chi_square import chi_square_pvalue

VOCAB = 4
RUNS = 400  # seeds per case; a wrong residual then gives p < 1e-8 (see the mutation test)
MUTANT_RUNS = 200  # a wrong residual is far off (p < 1e-8 at this size), so fewer runs prove it
DEPTH = 3  # tokens of the joint law tested, and the first round's draft length
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats, so prompt lookup finds a 3-token match
BOUND = 1e-3  # chi-square p-value: above for a lossless method, below for a mutated residual


@pytest.fixture(scope="module")
def small():
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(vocab=VOCAB, seed=3, layers=2, scale=0.5)  # p(first token) ~ [.003, .63, .13, .24]
    return {"target": target, "noisy": noisy_copy(target, noise=0.3), "unrelated": tiny_llama(vocab=VOCAB, seed=11)}


def exact_joint(lm, warp: Warp) -> torch.Tensor:
    """P(x1, x2, x3 | prompt) under the warped target, shape (V, V, V), by enumerating every prefix."""
    device = lm.device
    with torch.inference_mode():
        first = warp.probs(lm.model(torch.tensor([PROMPT], device=device)).logits[0, -1])  # (V,)
        ones = torch.tensor([PROMPT + [x] for x in range(VOCAB)], device=device)  # (V, T+1)
        second = warp.probs(lm.model(ones).logits[:, -1])  # (V, V): row x1
        twos = torch.tensor([PROMPT + [x, y] for x in range(VOCAB) for y in range(VOCAB)], device=device)  # (V², T+2)
        third = warp.probs(lm.model(twos).logits[:, -1]).reshape(VOCAB, VOCAB, VOCAB)  # (V, V, V): [x1, x2]
    return (first[:, None, None] * second[:, :, None] * third).cpu()  # (V, V, V)


def sampled_joint(options: DecodeOptions, lm, draft, runs: int = RUNS) -> tuple[torch.Tensor, list[int]]:
    """Counts of the first three tokens over `runs` seeds, and each run's first-round draft length."""
    counts = torch.zeros(VOCAB, VOCAB, VOCAB)
    first_drafts = []
    for seed in range(runs):
        trace = generate(DecodeOptions(**{**options.__dict__, "seed": seed, "record": False}), PROMPT, target=lm,
                         draft=draft)
        x1, x2, x3 = trace.output_ids[:DEPTH]
        counts[x1, x2, x3] += 1
        first_drafts.append(trace.rounds[0].n_drafted)
    return counts, first_drafts


def options_for(**settings) -> DecodeOptions:
    return DecodeOptions(method="speculative", max_new_tokens=DEPTH + 1, **{"temperature": 1.0, **settings})


# AdaEDL's λ is set where its entropy bound on this tiny pair stops some drafts at position 3 (rarely at 2): the
# draft length then depends on the sampled tokens, the case where a wrong stopping rule could bias the output.
CASES = {
    "draft model, static γ=3": dict(drafter="draft-model", rule="static", gamma=3),
    "draft model, AdaEDL": dict(drafter="draft-model", rule="adaedl", max_draft=4, lam=0.58),
    "draft model, γ=3, T=0.8 top-k 3 top-p 0.9": dict(drafter="draft-model", rule="static", gamma=3,
                                                       temperature=0.8, top_k=3, top_p=0.9),
    "layer skip, static γ=3": dict(drafter="layer-skip", rule="static", gamma=3, skip_layers=(1,)),
    "layer skip, AdaEDL": dict(drafter="layer-skip", rule="adaedl", max_draft=4, lam=0.56, skip_layers=(1,)),
    "prompt lookup, static γ=3 (deterministic drafts)": dict(drafter="prompt-lookup", rule="static", gamma=3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_first_three_tokens_follow_the_target(small, name):
    options = options_for(**CASES[name])
    warp = Warp(options.temperature, options.top_k, options.top_p)
    draft = small["noisy"] if options.drafter == "draft-model" else None
    counts, first_drafts = sampled_joint(options, small["target"], draft)
    if options.rule == "static":
        assert set(first_drafts) == {DEPTH}, f"{name}: the first round drafted {sorted(set(first_drafts))}, not γ"
    else:  # the rule decides: depth >= 2 in most runs, and it did cut some drafts short of the limit
        deep = sum(n >= 2 for n in first_drafts) / len(first_drafts)
        assert deep >= 0.75 and DEPTH in first_drafts and 2 in first_drafts, (name, deep, set(first_drafts))
    pvalue = chi_square_pvalue(counts, exact_joint(small["target"], warp))
    assert pvalue > BOUND, f"{name}: sampled joint differs from the target's (chi-square p = {pvalue:.2e})"


def test_baseline_sampling_follows_the_target(small):
    options = DecodeOptions(max_new_tokens=DEPTH, temperature=1.0)
    counts, _ = sampled_joint(options, small["target"], None)
    assert chi_square_pvalue(counts, exact_joint(small["target"], Warp(1.0))) > BOUND


@pytest.mark.parametrize("drafter", ["draft-model", "prompt-lookup", "layer-skip"])
def test_the_statistical_test_catches_a_wrong_residual(small, monkeypatch, drafter):
    """Mutation: resampling from r itself instead of norm(max(r - q, 0)) must fail the same bound."""
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    options = options_for(drafter=drafter, rule="static", gamma=3,
                          **({"skip_layers": (1,)} if drafter == "layer-skip" else {}))
    counts, first_drafts = sampled_joint(options, small["target"], small["unrelated"], runs=MUTANT_RUNS)
    assert set(first_drafts) == {DEPTH}
    pvalue = chi_square_pvalue(counts, exact_joint(small["target"], Warp(1.0)))
    assert pvalue < BOUND, f"{drafter}: the mutated residual went unnoticed (chi-square p = {pvalue:.2e})"
