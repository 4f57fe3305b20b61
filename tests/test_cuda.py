"""Every tensor on the model's device (issue 11, item 1).

CPU guards, always run: a sampled run inside `torch.device("meta")` puts any tensor the decoders create without an
explicit device on the meta device, where reading a value raises, so a CPU-only CI catches what would crash on a
GPU (a CPU one-hot or U(0,1) draw next to CUDA probabilities). The run's generator is asked for on the model's
device.

CUDA checks, run when a GPU is present (skipped with the reason otherwise): tiny float32 models on the GPU; every
lossless method's greedy output equals the baseline's, and sampled runs of every drafter complete.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from decoders import DecodeOptions, api, generate
from decoders import verify as core
from decoders.sampling import seeded_generator
from decoders.tree import DraftTree, Flavor

PROMPT = [10, 11, 12, 10, 11, 12, 10, 11]  # repeats: prompt lookup finds matches
SAMPLED = {
    "baseline": dict(),
    "draft model": dict(method="speculative", drafter="draft-model", rule="static", gamma=3),
    "draft model, AdaEDL, top-k/top-p": dict(method="speculative", drafter="draft-model", rule="adaedl", top_k=20,
                                             top_p=0.9),
    "prompt lookup": dict(method="speculative", drafter="prompt-lookup", rule="static", gamma=4),
    "layer skip": dict(method="speculative", drafter="layer-skip", rule="heuristic", skip_layers=(1, 2)),
}


# ---------------------------------------------------------------- CPU guards

@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_runs_create_no_tensor_off_the_model_device(tiny, drafts, name):
    options = DecodeOptions(temperature=1.0, max_new_tokens=24, seed=5, **SAMPLED[name])
    expected = generate(options, PROMPT, target=tiny, draft=drafts["unrelated"]).output_ids
    with torch.device("meta"):  # a tensor made without device= lands here, and reading it raises
        trace = generate(options, PROMPT, target=tiny, draft=drafts["unrelated"])
    assert trace.output_ids == expected  # the same run: nothing was made elsewhere either
    if options.method == "speculative":  # the residual path ran, not only acceptances
        assert trace.totals["accepted"] < trace.totals["drafted"]


def test_verifier_point_mass_is_made_where_p_lives():
    """A deterministic (prompt-lookup) candidate that is rejected: the one-hot and the residual stay with p."""
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.25] * 4])  # (2, V): the candidate 1 has p = 0, so it is rejected
    tree = DraftTree.root_only(0)
    tree.flavor = Flavor.DETERMINISTIC
    tree.add(0, 1)
    with torch.device("meta"):
        verdict = core.verify_sampling(tree, p, seeded_generator(p.device, 0))
    assert (verdict.path, verdict.token, verdict.source) == ([], 2, "resampled")


def test_generator_is_made_on_the_target_device(tiny, monkeypatch):
    asked = []

    def spy(device, seed):
        asked.append(device)
        return seeded_generator(device, seed)

    monkeypatch.setattr(api, "seeded_generator", spy)
    generate(DecodeOptions(temperature=1.0, max_new_tokens=3), PROMPT, target=tiny)
    assert asked == [next(tiny.model.parameters()).device]


def test_seeded_generator_on_the_cpu_is_the_old_stream():
    """Recorded CPU traces replay only if the seeded stream is exactly torch.Generator().manual_seed(seed)'s."""
    ours, old = seeded_generator("cpu", 7), torch.Generator().manual_seed(7)
    assert ours.device == torch.device("cpu")
    assert torch.equal(torch.rand(20, generator=ours), torch.rand(20, generator=old))


# ---------------------------------------------------------------- on a GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU checks need one")


def to_cuda(lm):
    """A fresh tiny model moved to the GPU (never the shared CPU fixtures)."""
    return replace(lm, model=lm.model.to("cuda"), device=torch.device("cuda"))


@pytest.fixture(scope="module")
def on_gpu():
    from tiny import noisy_copy, tiny_llama

    target = to_cuda(tiny_llama(layers=4))
    return {"target": target, "noisy": noisy_copy(target, noise=0.02), "unrelated": to_cuda(tiny_llama(seed=7))}


GREEDY = ([("draft-model", kind, rule, gamma) for kind in ("noisy", "unrelated")
           for rule, gamma in [("static", 3), ("heuristic", 2), ("max-confidence", 4), ("adaedl", 4)]]
          + [("prompt-lookup", None, "static", 4), ("prompt-lookup", None, "heuristic", 2)]
          + [("layer-skip", None, rule, gamma) for rule, gamma in [("static", 3), ("adaedl", 4)]])


@needs_cuda
@pytest.mark.parametrize("drafter,kind,rule,gamma", GREEDY, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in GREEDY])
def test_cuda_greedy_equals_the_baseline(on_gpu, drafter, kind, rule, gamma):
    target = on_gpu["target"]
    for prompt in ([3, 9, 4, 1, 7, 22, 5], PROMPT):
        baseline = generate(DecodeOptions(max_new_tokens=40), prompt, target=target)
        assert baseline.models["target"]["device"].startswith("cuda")
        options = DecodeOptions(method="speculative", drafter=drafter, rule=rule, gamma=gamma, max_draft=6,
                                max_new_tokens=40)
        trace = generate(options, prompt, target=target, draft=on_gpu[kind] if kind else None)
        assert trace.output_ids == baseline.output_ids, (drafter, kind, rule, prompt)


@needs_cuda
@pytest.mark.parametrize("name", list(SAMPLED))
def test_cuda_sampled_runs_complete(on_gpu, name):
    options = DecodeOptions(temperature=1.0, max_new_tokens=32, **SAMPLED[name])
    for seed in range(3):
        trace = generate(replace(options, seed=seed), PROMPT, target=on_gpu["target"], draft=on_gpu["unrelated"])
        assert len(trace.output_ids) == 32 and trace.stop_reason == "max_new_tokens"
        again = generate(replace(options, seed=seed), PROMPT, target=on_gpu["target"], draft=on_gpu["unrelated"])
        assert again.output_ids == trace.output_ids  # one seeded CUDA stream: reproducible


@needs_cuda
def test_cuda_verifier_rejects_a_copied_token_on_the_gpu():
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.25] * 4], device="cuda")  # the candidate 1 has p = 0
    tree = DraftTree.root_only(0)
    tree.flavor = Flavor.DETERMINISTIC
    tree.add(0, 1)
    verdict = core.verify_sampling(tree, p, seeded_generator(p.device, 0))
    assert (verdict.path, verdict.token, verdict.source) == ([], 2, "resampled")
