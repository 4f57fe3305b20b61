"""EAGLE-2 dynamic trees and DDD grown by a draft model (decoders/drafters/tree_draft.py), on tiny float32 models.

Greedy: token-for-token equal to the baseline. Sampling: the first two tokens' joint law equals exact enumeration
(and a wrong residual fails the same test). Structure: pool size, M nodes verified, depth, DDD's checks.
"""
from __future__ import annotations

import math

import pytest
import torch
from tree_helpers import BOUND, LENGTHS, PROMPT, PROMPTS, RUNS, TREES, baseline_ids, exact_pairs, \
    sampled_pairs, small_models, tree_options

from chi_square import chi_square_pvalue
from decoders import DecodeOptions, OptionsError, generate
from decoders import verify as core
from decoders.drafters.device_tree import read
from decoders.drafters.tree_draft import TreeShape, grow
from tree_reference import PoolNode, rerank
from decoders.sampling import Warp
from decoders.trace import Trace


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


def _grown(shape, expand, max_depth=64):
    """Grow on the device and read it back as the trace would (recording on)."""
    return read(grow(_peaked_root(), expand, shape, max_depth=max_depth), 0, shape.m, record=True)


def test_ddd_checks_confidence_only_at_its_steps():
    calls = []

    def expand(frontier):
        calls.append(frontier.size)
        return torch.log_softmax(torch.linspace(0, 3, 16), 0).expand(frontier.size, 16)  # (F, V)

    growth = _grown(TreeShape.ddd(k=2, m=8, checks=(5, 7, 9), threshold=-math.inf, steps=11, width=3), expand)
    assert [c["step"] for c in growth.ddd] == [5, 7, 9] and growth.steps == 11 and len(calls) == 10
    for check in growth.ddd:  # H = logsumexp of the frontier's cumulative log-probabilities before that step
        frontier = growth.frontiers[check["step"] - 2]
        expected = float(torch.logsumexp(torch.tensor([math.log(growth.pool[i]["value"]) for i in frontier]), 0))
        assert check["H"] == pytest.approx(expected) and check["stop"] is False


def test_ddd_stops_at_the_first_check_below_x():
    def expand(frontier):
        return torch.log_softmax(torch.linspace(0, 3, 16), 0).expand(frontier.size, 16)  # (F, V)

    # the frontier's mass only falls as it deepens, so some check lies below a threshold just under the first H
    first = _grown(TreeShape.ddd(k=2, m=8, checks=(5, 7, 9), threshold=-math.inf, steps=11, width=10), expand).ddd
    x = (first[0]["H"] + first[1]["H"]) / 2  # between step 5's and step 7's confidence
    growth = _grown(TreeShape.ddd(k=2, m=8, checks=(5, 7, 9), threshold=x, steps=11, width=10), expand)
    assert [c["stop"] for c in growth.ddd] == [False, True] and growth.stop == "ddd" and growth.steps == 6
    assert max(node["step"] for node in growth.pool) == 6 and len(growth.frontiers) == 6  # later steps dropped


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

MUTANT_RUNS = 300


@pytest.fixture(scope="module")
def small():
    return small_models()




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
