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


BEAMS = {"beam search": dict(method="beam-search"), "beam sampling": dict(method="beam-sampling", temperature=1.0),
         "dsbd": dict(method="dsbd", temperature=1.0, gamma=3)}


@pytest.mark.parametrize("name", list(BEAMS))
def test_beam_runs_create_no_tensor_off_the_model_device(tiny, drafts, name):
    """The beam bookkeeping (running scores, the finished pool, DSBD's layer scores) is made next to the logits."""
    options = DecodeOptions(model="tiny", width=3, max_new_tokens=12, seed=4, **BEAMS[name])
    expected = generate(options, PROMPT, target=tiny, draft=drafts["unrelated"]).output_ids
    with torch.device("meta"):
        trace = generate(options, PROMPT, target=tiny, draft=drafts["unrelated"])
    assert trace.output_ids == expected


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


TREES = {"eagle2": dict(drafter="eagle2", tree_k=3, tree_depth=4, tree_m=10),
         "ddd": dict(drafter="ddd", tree_k=3, tree_m=12, ddd_checks=(2, 3), ddd_x=-1.0, ddd_steps=5, ddd_width=4)}


@needs_cuda
@pytest.mark.parametrize("name", list(TREES))
def test_cuda_tree_drafters_equal_the_baseline_and_sample(on_gpu, name):
    """Trees grown by a draft model on the GPU: the tree mask, the frontier forward and the walk all on one device."""
    target = on_gpu["target"]
    for prompt in ([3, 9, 4, 1, 7, 22, 5], PROMPT):
        baseline = generate(DecodeOptions(max_new_tokens=30), prompt, target=target)
        for kind in ("noisy", "unrelated"):
            options = DecodeOptions(method="speculative", max_new_tokens=30, **TREES[name])
            trace = generate(options, prompt, target=target, draft=on_gpu[kind])
            assert trace.output_ids == baseline.output_ids, (name, kind, prompt)
    sampled = DecodeOptions(method="speculative", temperature=1.0, max_new_tokens=24, seed=3, **TREES[name])
    trace = generate(sampled, PROMPT, target=target, draft=on_gpu["unrelated"])
    assert len(trace.output_ids) == 24 and trace.totals["accepted"] < trace.totals["drafted"]


@needs_cuda
def test_cuda_eagle_head_trees_equal_the_baseline(on_gpu, tmp_path):
    """An EAGLE head saved on the CPU is loaded next to the GPU target and drafts from its GPU features."""
    from decoders.eagle.head import EagleHead
    from decoders.eagle.official import save_official

    target = on_gpu["target"]
    torch.manual_seed(0)
    save_official(EagleHead(target.model).cpu(), tmp_path / "head")
    baseline = generate(DecodeOptions(max_new_tokens=30), PROMPT, target=target)
    for name in TREES:
        options = DecodeOptions(method="speculative", eagle_head=str(tmp_path / "head"), max_new_tokens=30, **TREES[name])
        trace = generate(options, PROMPT, target=target)
        assert trace.output_ids == baseline.output_ids, name
        assert trace.rounds[0].search["method"] == f"{name}-head"


@needs_cuda
def test_cuda_beam_methods_match_the_cpu(on_gpu):
    """Beam search on the GPU picks the CPU's beams (float32, tiny); beam sampling and DSBD forests complete."""
    from tiny import tiny_llama

    cpu_target = tiny_llama(layers=4)
    gpu_target = on_gpu["target"]
    search = DecodeOptions(model="tiny", method="beam-search", width=3, max_new_tokens=16)
    assert (generate(search, PROMPT, target=gpu_target).output_ids
            == generate(search, PROMPT, target=cpu_target).output_ids)
    for method, extra in (("beam-sampling", {}), ("dsbd", {"gamma": 3})):
        options = DecodeOptions(model="tiny", method=method, width=3, temperature=1.0, max_new_tokens=16, seed=2,
                                **extra)
        trace = generate(options, PROMPT, target=gpu_target, draft=on_gpu["unrelated"])
        assert len(trace.output_ids) == 16 and trace.candidates, method
