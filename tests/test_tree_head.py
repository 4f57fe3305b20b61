"""The EAGLE-head tree drafter and the loop seams it needs, on tiny float32 models: the target's hidden states are
the head's features, observe() gets the accepted path, greedy equals the baseline, sampling follows the target
(chi-square against exact enumeration), official-format heads load, and the option says how to fix a missing head."""
from __future__ import annotations

import pytest
import torch
from tree_helpers import BOUND, LENGTHS, PROMPT, PROMPTS, RUNS, TREES, VOCAB, baseline_ids, exact_pairs, small_models, \
    tree_options

from chi_square import chi_square_pvalue
from decoders import DecodeOptions, OptionsError, generate
from decoders.drafters.tree_draft import TreeShape
from decoders.sampling import Warp


@pytest.fixture(scope="module")
def small():
    return small_models()


def run_with(drafter, lm, prompt, length, rule_depth=4, warp=None, seed=0):
    """Drive the one loop with a drafter object directly (the head drafter has no option name yet)."""
    from decoders import api
    from decoders.loop import run_rounds
    from decoders.recorder import TraceBuilder
    from decoders.rules import StaticRule
    from decoders.runtime.runner import CachedModel

    options = DecodeOptions(method="speculative", max_new_tokens=length)
    builder = TraceBuilder(api._new_trace(options, lm, None, "", prompt), lm.decode, True)
    trace = None
    for trace in run_rounds(CachedModel(lm.model), drafter, StaticRule(rule_depth), warp or Warp(0.0), prompt, length,
                            set(lm.eos_token_ids), torch.Generator().manual_seed(seed), builder):
        pass
    return trace


def test_forward_tree_hidden_states_are_the_features_the_lm_head_reads(tiny):
    from decoders.runtime.runner import CachedModel
    from decoders.tree import DraftTree

    runner = CachedModel(tiny.model)
    runner.forward([3, 9, 4])
    tree = DraftTree(tokens=[1, 20, 21, 30], parents=[-1, 0, 0, 1], q_token=[None] * 4)
    with torch.inference_mode():
        logits, hidden = runner.forward_tree(tree, hidden=True)  # (4, V), (4, H)
        assert hidden.shape == (4, tiny.model.config.hidden_size)
        assert torch.allclose(tiny.model.lm_head(hidden), logits, atol=1e-5)
    assert runner.length == 3 + 4  # one forward: the cache grew once


def test_observe_gets_the_accepted_path(tiny, drafts):
    from decoders.drafters import DynamicTreeDrafter

    seen = []

    class Spy(DynamicTreeDrafter):
        def observe(self, n_before, n_accepted, path=None, features=None):
            seen.append((n_accepted, list(path)))
            super().observe(n_before, n_accepted, path, features)

    trace = run_with(Spy(drafts["noisy"].model, TreeShape(k=3, steps=4, m=10)), tiny, PROMPTS[1], 20)
    assert [n for n, _ in seen] == [r.n_accepted for r in trace.rounds]
    for (n, path), rnd in zip(seen, trace.rounds):
        assert len(path) == n and [rnd.nodes[i].status for i in path] == ["accepted"] * n
    assert any(p != list(range(1, len(p) + 1)) for _, p in seen)  # some accepted branch is not the first one


@pytest.fixture(scope="module")
def head_pair():
    from tiny import tiny_llama

    from decoders.eagle.head import EagleHead

    target = tiny_llama(seed=5, layers=3)
    torch.manual_seed(0)
    return target, EagleHead(target.model)


@pytest.mark.parametrize("name", list(TREES))
def test_eagle_head_tree_greedy_equals_baseline(head_pair, name):
    from decoders import registry
    from decoders.drafters import EagleTreeDrafter

    target, head = head_pair
    shape = registry.tree_shape(tree_options(TREES[name]))
    for prompt in PROMPTS:
        for length in LENGTHS:
            trace = run_with(EagleTreeDrafter(head, shape), target, prompt, length, rule_depth=shape.steps)
            assert trace.output_ids == baseline_ids(target, prompt, length), (name, prompt, length)


def test_eagle_head_drafts_from_the_targets_real_features(head_pair):
    """With K = 1 the tree is the head's greedy chain; recompute it from scratch every round (fresh target features
    over the whole context, the head over all pairs without a cache) and compare: checks prefill, observe, catch-up
    and the tree-masked head cache."""
    from decoders.drafters import EagleTreeDrafter

    target, head = head_pair
    trace = run_with(EagleTreeDrafter(head, TreeShape(k=1, steps=3, m=3)), target, PROMPTS[1], 24, rule_depth=3)
    ids = list(PROMPTS[1])
    for rnd in trace.rounds:
        drafted = [node.token for node in rnd.nodes[1:]]
        assert drafted == _reference_head_chain(target, head, ids, len(drafted))
        ids += rnd.committed
    assert sum(r.n_drafted for r in trace.rounds) > 0


def _reference_head_chain(target, head, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
        feats = out.hidden_states[-1][0]  # (T-1, d): real features of every position before the pending token
        tokens = list(ids[1:])
        chain = []
        for _ in range(n):
            hidden, logits = head(torch.tensor([tokens]), feats[None])  # (1, L, d), (1, L, V)
            chain.append(int(logits[0, -1].argmax()))
            feats = torch.cat([feats, hidden[0, -1:]])  # the head's guess stands in for the draft's feature
            tokens.append(chain[-1])
    return chain


def test_eagle_head_tree_sampling_follows_the_target(small):
    from decoders.drafters import EagleTreeDrafter
    from decoders.eagle.head import EagleHead

    torch.manual_seed(0)
    head = EagleHead(small["target"].model)
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(RUNS):
        trace = run_with(EagleTreeDrafter(head, TreeShape(k=2, steps=2, m=4)), small["target"], PROMPT, 4,
                         rule_depth=2, warp=Warp(1.0), seed=seed)
        counts[trace.output_ids[0], trace.output_ids[1]] += 1
    pvalue = chi_square_pvalue(counts, exact_pairs(small["target"], Warp(1.0)))
    assert pvalue > BOUND, f"chi-square p = {pvalue:.2e}"


def test_eagle_head_option_loads_an_official_format_head(head_pair, tmp_path):
    from decoders.eagle.official import save_official

    target, head = head_pair
    save_official(head, tmp_path / "head")
    for drafter in ("eagle2", "ddd"):
        options = tree_options(dict(TREES["eagle2"] if drafter == "eagle2" else TREES["ddd"]),
                               eagle_head=str(tmp_path / "head"), max_new_tokens=20)
        trace = generate(options, PROMPTS[1], target=target)  # no draft model given, none needed
        assert trace.output_ids == baseline_ids(target, PROMPTS[1], 20)
        assert trace.rounds[0].search["method"] == f"{drafter}-head" and "EAGLE-head tree" in trace.label


def test_eagle_head_option_messages(head_pair):
    target, _ = head_pair
    with pytest.raises(OptionsError, match="python -m decoders.eagle train --target"):
        generate(tree_options(TREES["eagle2"], eagle_head="auto", model=target.name), PROMPTS[1], target=target)
    with pytest.raises(OptionsError, match="either an EAGLE head or a draft model"):
        tree_options(TREES["eagle2"], eagle_head="auto", draft_model="x").validate()
    with pytest.raises(OptionsError, match="eagle_head only applies to drafter 'eagle1' / 'eagle2' / 'ddd'"):
        DecodeOptions(method="speculative", drafter="draft-model", eagle_head="auto").validate()
