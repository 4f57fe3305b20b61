"""Tree primitives and one target forward over a whole tree through the stock transformers model."""
from __future__ import annotations

import random

import torch

from decoders.runtime.runner import CachedModel
from decoders.tree import (DraftTree, ancestor_mask, attention_mask_4d, children, depths, path_to, position_ids,
                           root_to_leaf_paths)

#      0
#    /   \
#   1     2
#  / \     \
# 3   4     5
PARENTS = [-1, 0, 0, 1, 1, 2]


def random_parents(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def test_mask_equals_ancestor_relation():
    for parents in [PARENTS] + [random_parents(30, s) for s in range(5)]:
        mask = ancestor_mask(parents)
        for i in range(len(parents)):
            ancestors = set(path_to(parents, i))
            assert {j for j in range(len(parents)) if mask[i, j]} == ancestors


def test_depths_positions_children_and_paths():
    assert depths(PARENTS) == [0, 1, 1, 2, 2, 2]
    assert position_ids(PARENTS, 10).tolist() == [10, 11, 11, 12, 12, 12]
    assert children(PARENTS) == [[1, 2], [3, 4], [5], [], [], []]
    assert root_to_leaf_paths(PARENTS) == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]


def test_4d_mask_layout():
    mask = attention_mask_4d(PARENTS, past_len=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    allowed = mask[0, 0] == 0
    assert allowed[:, :3].all()  # every node sees the whole cache
    assert torch.equal(allowed[:, 3:], ancestor_mask(PARENTS))
    assert mask.dtype == torch.float32 and mask.min() == torch.finfo(torch.float32).min


def _fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens], device=model.device)).logits[0]  # (T, V)


def test_chain_tree_matches_causal_forward(tiny):
    prefix, chain = [3, 9, 4, 1, 7], [11, 12, 13, 14]
    runner = CachedModel(tiny.model)
    runner.forward(prefix[:-1])
    tree = DraftTree.root_only(prefix[-1])
    for token in chain:
        tree.add(tree.size - 1, token)
    # Force the 4-D mask path even though the tree is a chain.
    tree_logits = _tree_forward_with_mask(runner, tree)
    expected = _fresh_logits(tiny.model, prefix + chain)[len(prefix) - 1:]
    assert torch.allclose(tree_logits, expected, atol=1e-4)


def _tree_forward_with_mask(runner: CachedModel, tree: DraftTree) -> torch.Tensor:
    start, device = runner.length, runner.device
    with torch.inference_mode():
        out = runner.model(input_ids=torch.tensor([tree.tokens], device=device),
                           attention_mask=attention_mask_4d(tree.parents, start, torch.float32).to(device),
                           position_ids=position_ids(tree.parents, start).to(device)[None],
                           past_key_values=runner.cache)
    return out.logits[0]


def test_siblings_do_not_see_each_other(tiny):
    prefix = [5, 2, 8]
    tokens = [prefix[-1], 20, 21, 30, 31, 40]
    tree = DraftTree(tokens=list(tokens), parents=list(PARENTS), q_token=[None] * 6)
    runner = CachedModel(tiny.model)
    runner.forward(prefix[:-1])
    logits = runner.forward_tree(tree)  # (6, V)
    for node in range(tree.size):
        path_tokens = [tokens[j] for j in path_to(PARENTS, node)]
        alone = _fresh_logits(tiny.model, prefix[:-1] + path_tokens)[-1]
        assert torch.allclose(logits[node], alone, atol=1e-4), f"node {node} saw a sibling"
    # and a plain causal mask over the same tokens is measurably different (the test can tell)
    causal = _fresh_logits(tiny.model, prefix[:-1] + tokens)[-1]
    assert not torch.allclose(causal, logits[5], atol=1e-3)


def test_commit_path_then_incremental_step_matches_fresh_forward(tiny):
    prefix = [5, 2, 8, 13]
    tokens = [prefix[-1], 20, 21, 30, 31, 40]
    runner = CachedModel(tiny.model)
    runner.forward(prefix[:-1])
    runner.forward_tree(DraftTree(tokens=list(tokens), parents=list(PARENTS), q_token=[None] * 6))
    runner.keep_path(6, [0, 2, 5])  # accept node 2 then node 5 (not a chain prefix: forces compaction)
    committed = prefix + [tokens[2], tokens[5]]  # every one of these now has its entries in the cache
    assert runner.length == len(committed)
    bonus = 17  # the target's own next token becomes the new pending token
    next_logits = runner.forward([bonus])[-1]
    assert torch.allclose(next_logits, _fresh_logits(tiny.model, committed + [bonus])[-1], atol=1e-4)


def test_chain_prefix_commit_is_a_crop(tiny):
    runner = CachedModel(tiny.model)
    runner.forward([1, 2, 3])
    runner.forward([4, 5, 6, 7])
    runner.keep_path(4, [0, 1])
    assert runner.length == 5
    assert torch.allclose(runner.forward([9])[-1], _fresh_logits(tiny.model, [1, 2, 3, 4, 5, 9])[-1], atol=1e-4)
