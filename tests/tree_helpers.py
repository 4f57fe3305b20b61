"""What the tree-drafter tests share: prompts, tree settings, the greedy baseline, and the small-vocabulary models
and exact enumeration behind the sampling tests (tests/test_tree_drafters.py, tests/test_tree_head.py)."""
from __future__ import annotations

import torch

from baselines import baseline_ids  # noqa: F401  (re-exported for the tree tests)
from decoders import DecodeOptions, generate
from decoders.sampling import Warp

PROMPTS = [[7], [3, 9, 4, 1, 7, 22, 5]]
LENGTHS = [1, 9, 30]
TREES = {
    "eagle1": dict(drafter="eagle1"),  # SpecLab's 24-node static tree
    "eagle1 wide": dict(drafter="eagle1", tree_paths=((0,), (1,), (2,), (0, 0), (1, 0), (0, 1), (2, 0), (0, 0, 0))),
    "eagle2": dict(drafter="eagle2", tree_k=3, tree_depth=4, tree_m=10),
    "eagle2 wide": dict(drafter="eagle2", tree_k=4, tree_depth=3, tree_m=20),
    "ddd": dict(drafter="ddd", tree_k=3, tree_m=12, ddd_checks=(2, 3), ddd_x=-1.0, ddd_steps=5, ddd_width=4),
}


def tree_options(settings: dict, **more) -> DecodeOptions:
    return DecodeOptions(method="speculative", **{**settings, **more})



# ---- sampling: the joint law of the first two tokens ----

VOCAB = 6
PROMPT = [1, 2, 3, 1, 2]
RUNS = 500
BOUND = 1e-3


def small_models() -> dict:
    """A 6-token target with a noisy copy and an unrelated model: small enough to enumerate every token pair."""
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(vocab=VOCAB, seed=3, layers=2, scale=0.5)
    return {"target": target, "noisy": noisy_copy(target, noise=0.3), "unrelated": tiny_llama(vocab=VOCAB, seed=11)}


def exact_pairs(lm, warp: Warp, prompt: list[int] = PROMPT) -> torch.Tensor:
    """P(x1, x2 | prompt) under the warped target, (V, V), by enumeration."""
    with torch.inference_mode():
        first = warp.probs(lm.model(torch.tensor([prompt], device=lm.device)).logits[0, -1])  # (V,)
        ones = torch.tensor([prompt + [x] for x in range(VOCAB)], device=lm.device)  # (V, T+1)
        second = warp.probs(lm.model(ones).logits[:, -1])  # (V, V)
    return (first[:, None] * second).cpu()  # (V, V)


def sampled_pairs(options: DecodeOptions, lm, draft, runs: int) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(runs):
        trace = generate(DecodeOptions(**{**options.__dict__, "seed": seed, "record": False}), PROMPT, target=lm,
                         draft=draft)
        x1, x2 = trace.output_ids[:2]
        counts[x1, x2] += 1
    return counts
