"""EAGLE-2 dynamic trees and DDD grown by a draft model (decoders/drafters/tree_draft.py), on tiny float32 models.

Greedy: token-for-token equal to the baseline. Sampling: the first two tokens' joint law equals exact enumeration
(and a wrong residual fails the same test). Structure: pool size, M nodes verified, depth, DDD's checks.
"""
from __future__ import annotations

import math

import pytest
import torch

from chi_square import chi_square_pvalue
from decoders import DecodeOptions, OptionsError, generate
from decoders import verify as core
from decoders.drafters.tree_draft import PoolNode, TreeShape, grow, rerank
from decoders.sampling import Warp
from decoders.trace import Trace
from decoders.tree import depths

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


def baseline_ids(lm, prompt, length) -> list[int]:
    return generate(DecodeOptions(max_new_tokens=length), prompt, target=lm).output_ids


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("kind", ["same", "noisy", "unrelated"])
def test_greedy_tree_equals_baseline(tiny, drafts, name, kind):
    for prompt in PROMPTS:
        for length in LENGTHS:
            trace = generate(tree_options(TREES[name], max_new_tokens=length), prompt, target=tiny, draft=drafts[kind])
            assert trace.output_ids == baseline_ids(tiny, prompt, length), (prompt, length)


@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_tree_equals_baseline_other_seeds_and_eos(seed):
    from tiny import noisy_copy, tiny_qwen2

    target = tiny_qwen2(seed=seed)
    draft = noisy_copy(target, noise=0.1, seed=seed)
    full = baseline_ids(target, PROMPTS[1], 25)
    eos = full[12]  # a token the baseline emits: both runs must stop at its first occurrence
    target_eos = target.with_eos(eos)
    for name in TREES:
        expected = baseline_ids(target_eos, PROMPTS[1], 25)
        trace = generate(tree_options(TREES[name], max_new_tokens=25), PROMPTS[1], target=target_eos, draft=draft)
        assert trace.output_ids == expected and trace.output_ids[-1] == eos, name
        assert trace.stop_reason == "eos"


def test_draft_equal_to_target_is_accepted_to_full_depth(tiny):
    # K = 1 grows the draft's greedy chain; the same model as draft is then accepted to depth D = 4 every round
    # (with K > 1 the argmax path can fall out of the frontier: EAGLE-2 ranks by cumulative value, not by step)
    options = tree_options(dict(drafter="eagle2", tree_k=1, tree_depth=4, tree_m=4), max_new_tokens=41)
    trace = generate(options, PROMPTS[1], target=tiny, draft=tiny)
    assert [r.n_accepted for r in trace.rounds] == [4] * 8 + [0]  # 8 rounds of 4 + 1, then 1 token left


# ---- structure -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k, depth, m", [(3, 4, 10), (2, 5, 7), (4, 3, 30)])
def test_pool_size_m_verified_and_depth(tiny, drafts, k, depth, m):
    options = tree_options(dict(drafter="eagle2", tree_k=k, tree_depth=depth, tree_m=m), max_new_tokens=30)
    trace = generate(options, PROMPTS[1], target=tiny, draft=drafts["noisy"])
    for rnd in trace.rounds:
        if rnd.n_drafted == 0:
            assert rnd.search is None  # the budget left no room for a draft (the last round): nothing was grown
            continue
        search = rnd.search
        pool_size = len(search["pool"])
        assert pool_size == k + (search["steps"] - 1) * k * k
        assert rnd.n_drafted == min(m, pool_size) == len(search["chosen"])
        assert max(node.depth for node in rnd.nodes) <= depth  # root depth 0: the bonus token makes D + 1
        assert search["flavor"] == "deterministic"
    assert trace.rounds[0].search["steps"] == depth


def test_chosen_set_is_the_top_m_by_value_and_ancestor_closed(tiny, drafts):
    trace = generate(tree_options(TREES["eagle2 wide"], max_new_tokens=10), PROMPTS[0], target=tiny,
                     draft=drafts["unrelated"])
    search = trace.rounds[0].search
    pool, chosen = search["pool"], search["chosen"]
    values = sorted((p["value"] for p in pool), reverse=True)
    assert sorted((pool[i]["value"] for i in chosen), reverse=True) == values[:len(chosen)]
    assert all(pool[i]["parent"] == -1 or pool[i]["parent"] in chosen for i in chosen)
    # tree node i+1 is chosen[i]: same token, and the pool parent maps to the tree parent
    node_of = {-1: 0, **{pool_id: i + 1 for i, pool_id in enumerate(chosen)}}
    for i, pool_id in enumerate(chosen):
        node = trace.rounds[0].nodes[i + 1]
        assert node.token == pool[pool_id]["token"] and node.parent == node_of[pool[pool_id]["parent"]]
    # values are products of draft probabilities along the path
    for item in pool:
        if item["parent"] >= 0:
            assert item["value"] <= pool[item["parent"]]["value"] + 1e-12


def test_the_static_tree_sends_exactly_its_paths(tiny, drafts):
    """EAGLE-1: node for path (r1, .., rd) is its parent's rank-rd candidate; every path is sent, one draft forward
    per depth that has children."""
    paths = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    trace = generate(tree_options(dict(drafter="eagle1", tree_paths=paths), max_new_tokens=12), PROMPTS[1],
                     target=tiny, draft=drafts["noisy"])
    rnd = trace.rounds[0]
    assert rnd.n_drafted == len(paths) == len(rnd.search["chosen"]) == len(rnd.search["pool"])
    assert rnd.draft_forwards == 1 + 2  # the root's forward, then depths 1 and 2 have children
    pool = rnd.search["pool"]
    by_path = {}
    for entry, path in zip(pool, paths):  # the pool is built depth by depth in the listed order
        by_path[path] = entry
        parent = by_path.get(path[:-1])
        assert entry["parent"] == (parent["id"] if parent else -1) and entry["depth"] == len(path)
    siblings = [by_path[(0,)], by_path[(1,)], by_path[(2,)]]  # ranks 0, 1, 2 of the root's candidates
    assert siblings[0]["value"] >= siblings[1]["value"] >= siblings[2]["value"]
    assert trace.label.endswith("EAGLE static tree (7 nodes, depth 3)")


def test_static_tree_paths_are_validated_with_a_fix():
    with pytest.raises(OptionsError, match="has no parent path 0"):
        DecodeOptions(method="speculative", drafter="eagle1", tree_paths=((1,), (0, 1))).validate()
    with pytest.raises(OptionsError, match="candidate rank"):
        DecodeOptions(method="speculative", drafter="eagle1", tree_paths=((-1,),)).validate()
    with pytest.raises(OptionsError, match="repeated"):
        DecodeOptions(method="speculative", drafter="eagle1", tree_paths=((0,), (0,))).validate()
    options = DecodeOptions(method="speculative", drafter="eagle1", tree_paths=((0,), (0, 1)))
    assert DecodeOptions.from_dict(options.to_dict()) == options  # JSON lists come back as tuples


def test_rerank_keeps_ancestors_on_ties():
    pool = [PoolNode(-1, 1, 0.0, 0.0, 1, 1), PoolNode(0, 2, 0.0, 0.0, 2, 2), PoolNode(-1, 3, -1.0, -1.0, 1, 1)]
    assert rerank(pool, 1) == [0]
    assert rerank(pool, 2) == [0, 1]


def test_ddd_with_x_minus_infinity_equals_eagle2_at_depth_n(tiny, drafts):
    k, n, m = 3, 5, 12
    ddd = tree_options(dict(drafter="ddd", tree_k=k, tree_m=m, ddd_x=-math.inf, ddd_steps=n, ddd_width=k),
                       max_new_tokens=30)
    eagle = tree_options(dict(drafter="eagle2", tree_k=k, tree_depth=n, tree_m=m), max_new_tokens=30)
    a = generate(ddd, PROMPTS[1], target=tiny, draft=drafts["noisy"])
    b = generate(eagle, PROMPTS[1], target=tiny, draft=drafts["noisy"])
    assert a.output_ids == b.output_ids
    assert [r.n_accepted for r in a.rounds] == [r.n_accepted for r in b.rounds]
    for ra, rb in zip(a.rounds, b.rounds):
        if ra.search is None or rb.search is None:  # a round with no room for a draft grows nothing
            assert ra.search is rb.search is None and ra.n_drafted == 0
            continue
        assert ra.search["steps"] == rb.search["steps"] and not any(c["stop"] for c in ra.search["ddd"])
        assert [(p["token"], p["parent"]) for p in ra.search["pool"]] == [(p["token"], p["parent"])
                                                                           for p in rb.search["pool"]]
        assert ra.search["chosen"] == rb.search["chosen"]


def _peaked_root(v: int = 16) -> torch.Tensor:
    return torch.log_softmax(torch.linspace(0, 3, v), 0)  # (V,)


def test_ddd_checks_confidence_only_at_its_steps():
    calls = []

    def expand(frontier, pool):
        calls.append(len(frontier))
        return torch.log_softmax(torch.linspace(0, 3, 16), 0).expand(len(frontier), 16)  # (F, V)

    shape = TreeShape.ddd(k=2, m=8, checks=(5, 7, 9), threshold=-math.inf, steps=11, width=3)
    growth = grow(_peaked_root(), expand, shape, max_depth=64)
    assert [c["step"] for c in growth.ddd] == [5, 7, 9] and growth.steps == 11 and len(calls) == 10
    for check in growth.ddd:  # H = logsumexp of the frontier's cumulative log-probabilities before that step
        frontier = growth.frontiers[check["step"] - 2]
        expected = float(torch.logsumexp(torch.tensor([growth.pool[i].log_value for i in frontier]), 0))
        assert check["H"] == pytest.approx(expected) and check["stop"] is False


def test_ddd_stops_at_the_first_check_below_x():
    def expand(frontier, pool):
        return torch.log_softmax(torch.linspace(0, 3, 16), 0).expand(len(frontier), 16)  # (F, V)

    # the frontier's mass only falls as it deepens, so some check lies below a threshold just under the first H
    first = grow(_peaked_root(), expand, TreeShape.ddd(k=2, m=8, threshold=-math.inf), 64).ddd
    x = (first[0]["H"] + first[1]["H"]) / 2  # between step 5's and step 7's confidence
    growth = grow(_peaked_root(), expand, TreeShape.ddd(k=2, m=8, threshold=x), 64)
    assert [c["stop"] for c in growth.ddd] == [False, True] and growth.stop == "ddd" and growth.steps == 6


def test_paper_defaults_and_fix_it_messages():
    options = DecodeOptions()
    assert (options.ddd_checks, options.ddd_x, options.ddd_steps, options.ddd_width) == ((5, 7, 9), -0.3, 11, 10)
    with pytest.raises(OptionsError, match="ddd_checks must be whole expansion steps"):
        DecodeOptions(method="speculative", drafter="ddd", ddd_checks=(1, 7)).validate()
    with pytest.raises(OptionsError, match="tree_k must be"):
        DecodeOptions(method="speculative", drafter="eagle2", tree_k=0).validate()
    with pytest.raises(OptionsError, match="ddd_x"):
        DecodeOptions(method="speculative", drafter="ddd", ddd_x=0.5).validate()


def test_trace_with_search_round_trips_and_old_rounds_still_load(tiny, drafts):
    trace = generate(tree_options(TREES["ddd"], max_new_tokens=8), PROMPTS[1], target=tiny, draft=drafts["noisy"])
    again = Trace.from_json(trace.to_json())
    assert again.rounds[0].search == trace.rounds[0].search and again.rounds[0].search["pool"]
    data = trace.to_dict()
    for rnd in data["rounds"]:
        del rnd["search"]  # a version-1 trace from before tree drafters
    assert Trace.from_dict(data).rounds[0].search is None


# ---- sampling: the joint law of the first two tokens ------------------------------------------------------------

VOCAB = 6
PROMPT = [1, 2, 3, 1, 2]
RUNS = 500
MUTANT_RUNS = 300
BOUND = 1e-3


@pytest.fixture(scope="module")
def small():
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(vocab=VOCAB, seed=3, layers=2, scale=0.5)
    return {"target": target, "noisy": noisy_copy(target, noise=0.3), "unrelated": tiny_llama(vocab=VOCAB, seed=11)}


def exact_pairs(lm, warp: Warp) -> torch.Tensor:
    """P(x1, x2 | prompt) under the warped target, (V, V), by enumeration."""
    with torch.inference_mode():
        first = warp.probs(lm.model(torch.tensor([PROMPT], device=lm.device)).logits[0, -1])  # (V,)
        ones = torch.tensor([PROMPT + [x] for x in range(VOCAB)], device=lm.device)  # (V, T+1)
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


SAMPLED = {
    "eagle1 T=1": (dict(drafter="eagle1", tree_paths=((0,), (1,), (0, 0), (0, 1), (1, 0))), {}),
    "eagle2 T=1": (dict(drafter="eagle2", tree_k=2, tree_depth=2, tree_m=4), {}),
    # x sits between the confidence after the prompt (H = -0.060: round 1 stops at depth 1) and after some first
    # tokens (H = -0.043: round 2 grows to depth 3), so where DDD cuts depends on the sampled tokens
    "ddd T=0.8 top-k 4": (dict(drafter="ddd", tree_k=2, tree_m=5, ddd_checks=(2,), ddd_x=-0.05, ddd_steps=3,
                               ddd_width=2), dict(temperature=0.8, top_k=4)),
}


def test_the_sampled_ddd_case_cuts_in_some_rounds_and_not_others(small):
    settings, warp_settings = SAMPLED["ddd T=0.8 top-k 4"]
    cuts = set()
    for seed in range(6):
        options = tree_options(settings, max_new_tokens=4, seed=seed, **{"temperature": 1.0, **warp_settings})
        trace = generate(options, PROMPT, target=small["target"], draft=small["noisy"])
        cuts |= {check["stop"] for r in trace.rounds if r.search for check in r.search["ddd"]}
    assert cuts == {True, False}


@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_tree_first_two_tokens_follow_the_target(small, name):
    settings, warp_settings = SAMPLED[name]
    options = tree_options(settings, max_new_tokens=4, **{"temperature": 1.0, **warp_settings})
    counts = sampled_pairs(options, small["target"], small["noisy"], RUNS)
    warp = Warp(options.temperature, options.top_k, options.top_p)
    pvalue = chi_square_pvalue(counts, exact_pairs(small["target"], warp))
    assert pvalue > BOUND, f"{name}: chi-square p = {pvalue:.2e}"


def test_the_statistical_test_catches_a_wrong_residual_on_trees(small, monkeypatch):
    """Mutation: after a rejected candidate, keep r instead of removing the candidate's mass."""
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    settings, _ = SAMPLED["eagle2 T=1"]
    options = tree_options(settings, max_new_tokens=4, temperature=1.0)
    counts = sampled_pairs(options, small["target"], small["unrelated"], MUTANT_RUNS)
    pvalue = chi_square_pvalue(counts, exact_pairs(small["target"], Warp(1.0)))
    assert pvalue < BOUND, f"the mutated residual went unnoticed (chi-square p = {pvalue:.2e})"


# ---- the seams and the EAGLE-head drafter -----------------------------------------------------------------------

def run_with(drafter, lm, prompt, length, rule_depth=4, warp=None, seed=0):
    """Drive the one loop with a drafter object directly (the head drafter has no option name yet)."""
    from decoders import api
    from decoders.loop import run_rounds
    from decoders.recorder import TraceBuilder
    from decoders.rules import StaticRule
    from decoders.runner import CachedModel

    options = DecodeOptions(method="speculative", max_new_tokens=length)
    builder = TraceBuilder(api._new_trace(options, lm, None, "", prompt), lm.decode, True)
    trace = None
    for trace in run_rounds(CachedModel(lm.model), drafter, StaticRule(rule_depth), warp or Warp(0.0), prompt, length,
                            set(lm.eos_token_ids), torch.Generator().manual_seed(seed), builder):
        pass
    return trace


def test_forward_tree_hidden_states_are_the_features_the_lm_head_reads(tiny):
    from decoders.runner import CachedModel
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
    from decoders import api
    from decoders.drafters import EagleTreeDrafter

    target, head = head_pair
    shape = api.tree_shape(tree_options(TREES[name]))
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
    with pytest.raises(OptionsError, match="eagle_head only applies to the tree drafters"):
        DecodeOptions(method="speculative", drafter="draft-model", eagle_head="auto").validate()
