"""Gemma 3's sliding-window layers (issue 11 item 5) on a tiny Gemma that mixes sliding and full attention.

Window 8, prompts and outputs longer than it: the tree mask must be cut per layer type, the sliding cache must
roll back and stay bounded, and the layer-skip draft must keep the layers transformers sizes its masks from.
"""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, generate
from decoders.drafters import LayerSkipDrafter, default_skip_layers
from decoders.runtime.runner import CachedModel
from decoders.tree import DraftTree
from tiny import MIXED_LAYER_TYPES, tiny_gemma3_mixed, tiny_llama

WINDOW = 8
PROMPTS = [list(range(3, 23)), [10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11]]  # 20 and 14 > window


@pytest.fixture(scope="module")
def gemma():
    torch.set_num_threads(1)
    return tiny_gemma3_mixed(sliding_window=WINDOW)


def plain_logits(lm, ids: list[int]) -> torch.Tensor:
    """transformers' own full-sequence forward, no cache: the reference. (len, V)"""
    with torch.inference_mode():
        return lm.model(input_ids=torch.tensor([ids], device=lm.device)).logits[0]


def path_of(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("parents", [[-1, 0, 0, 1, 1, 2, 3, 6, 7, 8, 9],  # branching, deeper than the window
                                     [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])  # a chain
def test_tree_verification_logits_equal_a_plain_forward(gemma, parents):
    prompt = PROMPTS[0]
    tokens = [5 + (7 * i) % 50 for i in range(len(parents))]
    runner = CachedModel(gemma.model)
    runner.forward(prompt[:-1])
    tree = DraftTree(tokens=[prompt[-1]] + tokens[1:], parents=parents, q_token=[None] * len(parents))
    logits = runner.forward_tree(tree)  # (N+1, V)
    for node in range(len(parents)):
        sequence = prompt[:-1] + [tree.tokens[i] for i in path_of(parents, node)]
        torch.testing.assert_close(logits[node], plain_logits(gemma, sequence)[-1], rtol=1e-4, atol=1e-4)


def test_tree_after_rounds_past_the_window_equals_a_plain_forward(gemma):
    """Round after round (kept paths, the sliding cache trimmed and rolled back), the tree still sees the truth."""
    runner = CachedModel(gemma.model)
    context = PROMPTS[0][:-1]
    runner.forward(context)
    parents = [-1, 0, 0, 1, 2, 3]
    for round_ in range(6):
        tokens = [(round_ * 11 + 3 * i) % 60 + 1 for i in range(len(parents))]
        tree = DraftTree(tokens=tokens, parents=parents, q_token=[None] * len(parents))
        logits = runner.forward_tree(tree)
        for node in range(len(parents)):
            sequence = context + [tokens[i] for i in path_of(parents, node)]
            torch.testing.assert_close(logits[node], plain_logits(gemma, sequence)[-1], rtol=1e-4, atol=1e-4)
        keep = path_of(parents, 4)  # root, 2, 4: not a chain prefix, so the slots are compacted
        runner.keep_path(tree.size, keep)
        context = context + [tokens[i] for i in keep]
        assert runner.length == len(context)


def hf_greedy(lm, prompt, length) -> list[int]:
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt], device=lm.device), max_new_tokens=length, do_sample=False,
                                pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("options", [
    DecodeOptions(max_new_tokens=24),
    DecodeOptions(method="speculative", drafter="layer-skip", rule="static", gamma=4, max_new_tokens=24),
    DecodeOptions(method="speculative", drafter="layer-skip", skip_layers=(1, 3, 4), rule="static", gamma=3,
                  max_new_tokens=24),
    DecodeOptions(method="speculative", drafter="prompt-lookup", rule="static", gamma=4, max_new_tokens=24),
], ids=["baseline", "layer-skip-default", "layer-skip-sliding-only", "prompt-lookup"])
def test_greedy_equals_transformers_generate(gemma, options):
    for prompt in PROMPTS:
        assert generate(options, prompt, target=gemma).output_ids == hf_greedy(gemma, prompt, 24)


def test_greedy_tree_drafter_equals_transformers_generate(gemma):
    """EAGLE-2's dynamic tree is verified through the tree mask, which on sliding layers must be cut to the window.
    (The draft is a tiny Llama: this checks the target's verification, not a sliding-window draft.)"""
    options = DecodeOptions(method="speculative", drafter="eagle2", tree_k=3, tree_depth=4, tree_m=10,
                            max_new_tokens=24)
    draft = tiny_llama(seed=3)
    for prompt in PROMPTS:
        assert generate(options, prompt, target=gemma, draft=draft).output_ids == hf_greedy(gemma, prompt, 24)


def test_default_skip_set_keeps_full_attention_layers():
    skip = default_skip_layers(18, [("full_attention" if i % 6 == 5 else "sliding_attention") for i in range(18)])
    assert skip and not {5, 11, 17} & set(skip)  # gemma3-270m: full attention at 5, 11, 17
    assert default_skip_layers(30) == [9, 11, 13, 15, 17, 19, 21, 23]  # all-full models keep the measured set


def test_skipping_the_first_full_attention_layer_is_refused_by_name(gemma):
    first_full = MIXED_LAYER_TYPES.index("full_attention")
    with pytest.raises(ValueError, match=f"layer {first_full}, the first full-attention layer"):
        LayerSkipDrafter(CachedModel(gemma.model), skip=[1, first_full])


def test_options_message_does_not_claim_the_mask_comes_from_layer_0():
    from decoders.options import OptionsError
    with pytest.raises(OptionsError) as caught:
        DecodeOptions(method="speculative", drafter="layer-skip", skip_layers=(0, 3)).validate()
    assert "mask" not in str(caught.value)


@pytest.mark.parametrize("options", [
    DecodeOptions(max_new_tokens=40),
    DecodeOptions(method="speculative", drafter="layer-skip", skip_layers=(1, 3), rule="static", gamma=3,
                  max_new_tokens=40),
], ids=["baseline", "layer-skip"])
def test_sliding_cache_stays_bounded(gemma, options, monkeypatch):
    """After each round no sliding layer holds more than window - 1 entries, however long the output."""
    from decoders.runtime import runner as runner_module

    biggest = []
    keep_path = runner_module.CachedModel.keep_path

    def recording_keep_path(self, block, keep):
        keep_path(self, block, keep)
        biggest.append(max(layer.keys.shape[2] for layer in self.cache.layers if layer.is_sliding))

    monkeypatch.setattr(runner_module.CachedModel, "keep_path", recording_keep_path)
    generate(options, PROMPTS[0], target=gemma)
    assert len(biggest) >= 10 and max(biggest) <= WINDOW - 1


def test_a_sliding_window_draft_is_refused_by_the_tree_drafters_with_a_fix():
    """Frontier after frontier in the draft's own cache outruns what a sliding layer keeps: refuse, say what to do."""
    from decoders.drafters.tree_draft import DynamicTreeDrafter
    from decoders.options import DecodeOptions, OptionsError
    from decoders.registry import tree_shape

    with pytest.raises(OptionsError, match="sliding-window draft.*pick a draft without"):
        DynamicTreeDrafter(tiny_gemma3_mixed().model, tree_shape(DecodeOptions(method="speculative",
                                                                               drafter="eagle2")))
