"""What the static-buffer and CUDA-graph tests share (tests/test_buffers.py, tests/test_graphs.py): prompts, every
method that decodes through CachedModel, and a tiny target with every kind of drafter it can have (a draft model, a
saved EAGLE head, a saved early-exit block and prophet)."""
from __future__ import annotations

import torch

from decoders import DecodeOptions

PROMPTS = {"short": [10, 11, 12, 10, 11, 12, 10, 11],  # repeats: prompt lookup finds matches
           "long": [3, 9, 4, 1, 7, 22, 5, 8, 30, 2, 9, 4, 1, 7, 40, 5, 6, 33, 12, 3]}  # a 19-token prefill: width 32
LENGTH = 30
TREE = dict(tree_k=3, tree_depth=4, tree_m=10)
DDD = dict(tree_k=3, tree_m=12, ddd_checks=(2, 3), ddd_x=-1.0, ddd_steps=5, ddd_width=4)
METHODS = {
    "baseline": dict(),
    "draft model, static": dict(method="speculative", drafter="draft-model", rule="static", gamma=3),
    "draft model, AdaEDL": dict(method="speculative", drafter="draft-model", rule="adaedl", max_draft=6),
    "prompt lookup": dict(method="speculative", drafter="prompt-lookup", gamma=4),
    "layer skip": dict(method="speculative", drafter="layer-skip", skip_layers=(1, 2)),
    "eagle1": dict(method="speculative", drafter="eagle1"),
    "eagle2": dict(method="speculative", drafter="eagle2", **TREE),
    "ddd": dict(method="speculative", drafter="ddd", **DDD),
    "eagle2 head": dict(method="speculative", drafter="eagle2", eagle_head="HEAD", **TREE),
    "ddd head": dict(method="speculative", drafter="ddd", eagle_head="HEAD", **DDD),
    "early exit": dict(method="speculative", drafter="early-exit", self_weights="EXIT", rule="adaedl"),
    "prophet": dict(method="speculative", drafter="prophet", self_weights="PROPHET", gamma=3),
}


def drafter_pair(folder, move=lambda lm: lm) -> dict:
    """A 4-layer target, a noisy copy as draft model, and an EAGLE head, exit block (k 1) and prophet saved in
    `folder` (made on the CPU; `move` puts the models where the test runs them)."""
    from tiny import noisy_copy, tiny_llama

    from decoders.eagle.head import EagleHead
    from decoders.eagle.official import save_official
    from decoders.selfdraft import store
    from decoders.selfdraft.heads import ExitBlock, Prophet

    target = tiny_llama(seed=5, layers=4)
    torch.manual_seed(0)
    save_official(EagleHead(target.model).cpu(), folder / "head")
    block = ExitBlock(target.model, 1)
    prophet = Prophet(target.model, 1)
    with torch.no_grad():  # noise: drafts the target sometimes rejects, so rollback runs
        for module in (block.layers, prophet):
            for p in module.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(p.device))
    store.save(block, folder / "exit")
    store.save(prophet, folder / "prophet")
    paths = {"HEAD": str(folder / "head"), "EXIT": str(folder / "exit"), "PROPHET": str(folder / "prophet")}
    return {"target": move(target), "draft": move(noisy_copy(target, noise=0.05)), "paths": paths}


def options_for(name: str, pair: dict, **more) -> DecodeOptions:
    settings = {k: pair["paths"].get(v, v) if isinstance(v, str) else v for k, v in METHODS[name].items()}
    return DecodeOptions(max_new_tokens=LENGTH, **settings, **more)
