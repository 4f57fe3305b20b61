"""Suffix decoding (decoders/drafters/suffix.py, suffix_tree.py): the suffix tree's counts against brute force, the
draft's size following the match length and the counts as in the paper, the store (bounded, first in first out,
read and never written by a run), and losslessness: greedy equal to the baseline token for token; the first two
sampled tokens' joint law equal to exact enumeration, with branching trees drafted from a store; a wrong residual
fails that same test."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from tree_helpers import BOUND, RUNS, VOCAB, baseline_ids, exact_pairs, small_models

from chi_square import chi_square_pvalue
from decoders import DecodeOptions, OptionsError, SuffixStore, generate, registry
from decoders import verify as core
from decoders.drafters.suffix_tree import Growing, SuffixTree, grow
from decoders.sampling import Warp


def suffix(**more) -> DecodeOptions:
    return DecodeOptions(method="speculative", drafter="suffix", **more)


def substring_counts(sequences: list[list[int]], depth: int) -> Counter:
    """How often each token string of 1..depth tokens occurs, counted directly."""
    counts = Counter()
    for seq in sequences:
        for start in range(len(seq)):
            for end in range(start + 1, min(start + depth, len(seq)) + 1):
                counts[tuple(seq[start:end])] += 1
    return counts


def tree_counts(tree: SuffixTree) -> Counter:
    counts, todo = Counter(), [((), tree.root)]
    while todo:
        path, node = todo.pop()
        for token, child in node.children.items():
            counts[path + (token,)] = child.count
            todo.append((path + (token,), child))
    return counts


# ---- the suffix tree ----------------------------------------------------------------------------------------------

def test_counts_equal_brute_force_whether_added_whole_grown_or_removed():
    rng = random.Random(0)
    sequences = [[rng.randrange(5) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
    whole = SuffixTree(depth=6)
    for seq in sequences:
        whole.add(seq)
    assert tree_counts(whole) == substring_counts(sequences, 6)
    grown = SuffixTree(depth=6)
    Growing(grown, sequences[0])
    assert tree_counts(grown) == substring_counts(sequences[:1], 6)
    whole.remove(sequences[2])
    assert tree_counts(whole) == substring_counts(sequences[:2] + sequences[3:], 6)  # no zero-count node left
    assert whole.root.count == sum(len(s) for s in sequences) - len(sequences[2])


def test_the_draft_follows_the_counts_and_the_match_length():
    """After "1 2", 3 followed twice and 4 once: the draft puts 3 first (2/3) and 4 beside it (1/3); the longest
    tail "9 1 2" occurred once, followed by 4, and its cap (3 tokens) lets more of that branch in."""
    tree = SuffixTree(depth=8)
    for seq in ([1, 2, 3, 5], [1, 2, 3, 6], [9, 1, 2, 4, 7, 8]):
        tree.add(seq)
    short = tree.speculate([5, 1, 2], max_tokens=16, factor=1.0, min_prob=0.1, max_depth=16)
    assert short.match_len == 2 and short.cap == 2
    assert [(n.token, n.parent, round(n.prob, 3), n.count, n.of) for n in short.nodes] == \
        [(3, -1, 0.667, 2, 3), (4, -1, 0.333, 1, 3)]
    assert [n.token for n in short.left] == [5, 6, 7]  # passed min_prob, did not fit the cap of 2
    long = tree.speculate([9, 1, 2], max_tokens=16, factor=1.0, min_prob=0.1, max_depth=16)
    assert long.match_len == 3 and [n.token for n in long.nodes] == [4, 7, 8] and long.score == 3.0
    assert tree.speculate([9, 1, 2], max_tokens=2, factor=1.0, min_prob=0.1, max_depth=16).cap == 2  # max_tokens
    assert [n.token for n in tree.speculate([9, 1, 2], 16, 2.0, 0.1, max_depth=2).nodes] == [4, 7]  # the budget
    assert tree.speculate([8, 8], 16, 1.0, 0.1, 16).nodes == []  # "8 8" never occurred; nothing followed "8"


def test_the_runs_own_tail_is_not_counted_as_an_earlier_occurrence():
    """The run's tree holds the context itself: "1 2" occurred once before the end, followed by 3 (estimate 1, not
    1/2), and a tail that only occurs at the end ("2 9") is no match at all."""
    own = SuffixTree(depth=8)
    Growing(own, [1, 2, 3, 1, 2])
    draft = own.speculate([1, 2, 3, 1, 2], 16, 1.0, 0.1, 16, seen=1)
    assert draft.match_len == 2 and [(n.token, n.prob, n.count, n.of) for n in draft.nodes] == [(3, 1.0, 1, 1),
                                                                                               (1, 1.0, 1, 1)]
    Growing(own, [9])  # (a second sequence in the same tree, for the check below)
    assert own.speculate([1, 2, 9], 16, 1.0, 0.1, 16, seen=1).match_len == 0


def test_min_prob_prunes_rare_continuations_and_eos_ends_a_branch():
    tree = SuffixTree(depth=8)
    for seq in [[1, 2]] * 9 + [[1, 3]]:
        tree.add(seq)
    node = tree.find([1])
    assert [n.token for n in grow(node, 8, 0.1, 8, frozenset()).nodes] == [2, 3]  # 3 followed 1 in 1 of 10: 0.1
    assert [n.token for n in grow(node, 8, 0.11, 8, frozenset()).nodes] == [2]
    tree.add([1, 2, 5, 6])
    assert [n.token for n in grow(tree.find([1]), 8, 0.05, 8, frozenset({2})).nodes] == [2, 3]  # nothing after EOS 2


# ---- losslessness -------------------------------------------------------------------------------------------------

REPEATING = [3, 9, 4, 1, 7, 22, 5, 3, 9, 4, 1, 7]


@pytest.mark.parametrize("prompt", [[7], [3, 9, 4, 1, 7, 22, 5], REPEATING])
@pytest.mark.parametrize("length", [1, 9, 40])
@pytest.mark.parametrize("settings", [{}, dict(suffix_factor=4.0, suffix_min_prob=0.0, suffix_tokens=24),
                                      dict(suffix_depth=3, suffix_tokens=2), dict(controller="cost")])
def test_greedy_equals_the_baseline(tiny, prompt, length, settings):
    expected = baseline_ids(tiny, prompt, length)
    store = SuffixStore()
    store.add(baseline_ids(tiny, REPEATING, 30))  # an earlier output that partly repeats: long drafts, some wrong
    for run_store in (None, store):
        trace = generate(suffix(max_new_tokens=length, **settings), prompt, target=tiny, store=run_store)
        assert trace.output_ids == expected, (prompt, length, settings, run_store is not None)


def test_a_store_holding_the_answer_is_accepted_in_long_rounds(tiny):
    answer = baseline_ids(tiny, REPEATING, 40)
    store = SuffixStore()
    store.add(answer)
    cold = generate(suffix(max_new_tokens=40), REPEATING, target=tiny)
    warm = generate(suffix(max_new_tokens=40), REPEATING, target=tiny, store=store)
    assert warm.output_ids == cold.output_ids == answer
    assert len(warm.rounds) < len(cold.rounds) / 2 and max(r.n_accepted for r in warm.rounds) >= 8
    assert any(r.search["source"] == "earlier outputs" for r in warm.rounds)
    assert store.summary() == {"outputs": 1, "tokens": 40}  # the run read the store and added nothing


def test_eos_is_honoured(tiny):
    full = baseline_ids(tiny, REPEATING, 30)
    eos = full[17]
    target = tiny.with_eos(eos)
    store = SuffixStore()
    store.add(full)  # the stored answer runs on past the EOS: the run must still stop at it
    trace = generate(suffix(max_new_tokens=30), REPEATING, target=target, store=store)
    assert trace.output_ids == baseline_ids(target, REPEATING, 30) and trace.output_ids[-1] == eos
    assert trace.stop_reason == "eos"


@pytest.fixture(scope="module")
def small():
    return small_models()


SAMPLED_PROMPT = [5, 4, 3, 1, 2]  # no tail of it occurs earlier in it: every draft comes from the store


def branching_store() -> SuffixStore:
    """Earlier outputs in which several tokens followed SAMPLED_PROMPT's tail "1 2" and then "2 x": the drafts
    branch at both of the first two positions, so recursive rejection walks siblings there."""
    store = SuffixStore()
    for seq in ([1, 2, 0, 4], [1, 2, 3, 1], [1, 2, 4, 5], [1, 2, 5, 0], [2, 0, 1], [2, 3, 3], [2, 3, 0]):
        store.add(seq)
    return store


def sampled_pairs(options: DecodeOptions, lm, runs: int) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    store = branching_store()
    for seed in range(runs):
        trace = generate(DecodeOptions(**{**options.__dict__, "seed": seed, "record": False}), SAMPLED_PROMPT,
                         target=lm, store=store)
        x1, x2 = trace.output_ids[:2]
        counts[x1, x2] += 1
    return counts


SAMPLING = dict(max_new_tokens=4, temperature=1.0, suffix_min_prob=0.0, suffix_factor=4.0)


def test_the_sampled_drafts_are_trees(small):
    trace = generate(suffix(**SAMPLING, seed=1), SAMPLED_PROMPT, target=small["target"], store=branching_store())
    parents = [node.parent for node in trace.rounds[0].nodes]
    assert len(parents) - 1 > max(node.depth for node in trace.rounds[0].nodes)  # more nodes than depth: branches


def test_sampled_first_two_tokens_follow_the_target(small):
    counts = sampled_pairs(suffix(**SAMPLING), small["target"], RUNS)
    pvalue = chi_square_pvalue(counts, exact_pairs(small["target"], Warp(1.0), SAMPLED_PROMPT))
    assert pvalue > BOUND, f"chi-square p = {pvalue:.2e}"


def test_the_statistical_test_catches_a_wrong_residual(small, monkeypatch):
    """Mutation: after a rejected candidate, keep r instead of removing the candidate's mass."""
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    counts = sampled_pairs(suffix(**SAMPLING), small["target"], RUNS)
    pvalue = chi_square_pvalue(counts, exact_pairs(small["target"], Warp(1.0), SAMPLED_PROMPT))
    assert pvalue < BOUND, f"the mutated residual went unnoticed (chi-square p = {pvalue:.2e})"


# ---- the cost controller: how much of the draft to send --------------------------------------------------------

def priced_round(drafter, rule, ids):
    rule.limit()
    return drafter.propose(ids, 16, rule, None, None, True)


def test_the_cost_controller_sends_nothing_once_short_matches_keep_failing():
    """Chat: tails of a token or two recur, and the counts say "always followed by x" from one occurrence, but the
    target rejects them. The calibration learns that and the drafter stops sending (a draft costs no forward, so
    sending nothing is the plain step); the unsent candidates stay in the trace's pool."""
    from decoders.controller import TreeCostRule
    from decoders.drafters.suffix import Settings, SuffixDrafter

    rule = TreeCostRule(t=lambda n: 1 + 0.15 * (n - 1), c=0.0, steps=16, learn_kappa=False)  # about SmolLM2's CPU
    drafter = SuffixDrafter(Settings(depth=24, max_tokens=16, factor=2.0, min_prob=0.1))
    ids = [5, 6, 7, 8, 9, 1, 2, 40, 41, 42, 1, 2]  # "1 2" occurred once, followed by 40 41 42 1
    drafter.start(ids)
    sent = []
    for _ in range(8):
        proposal = priced_round(drafter, rule, ids)
        sent.append(proposal.tree.n_drafted)
        drafter.observe(len(ids), 0, path=[])  # the target rejected the first draft every time
        rule.update(0, proposal.tree.n_drafted)
    assert sent[0] == 3  # the priors (0.6 at a 2-token match, 0.7, 0.7, 0.8): chances .6 .42 .29 .24; .24 costs more
    assert sent[-1] == 0 and sent == sorted(sent, reverse=True)
    search = proposal.search
    assert search["stop"] == "cost" and search["chosen"] == []
    assert [entry["chance"] is not None for entry in search["pool"]] == [True] * 4 + [False]  # + one past the cap
    assert search["trust"] < 0.15 and rule.kappa == 1.0  # the drafter calibrates; the rule's κ stays put


def test_a_class_priced_out_is_probed_again():
    """Once nothing is sent, a class is never tested again unless the drafter probes: after PROBE_EVERY rounds that
    sent nothing it sends its best node, recorded as a probe, and a probe the target accepts raises the trust."""
    from decoders.controller import TreeCostRule
    from decoders.drafters.suffix import PROBE_EVERY, Settings, SuffixDrafter

    rule = TreeCostRule(t=lambda n: 1 + 0.15 * (n - 1), c=0.0, steps=16, learn_kappa=False)
    drafter = SuffixDrafter(Settings(depth=24, max_tokens=16, factor=2.0, min_prob=0.1))
    ids = [5, 6, 7, 8, 9, 1, 2, 40, 41, 42, 1, 2]
    drafter.start(ids)
    sent, probes = [], []
    for _ in range(30):
        proposal = priced_round(drafter, rule, ids)
        sent.append(proposal.tree.n_drafted)
        probes.append(rule.last.get("probe", False))
        accepted = 1 if probes[-1] else 0  # the target rejects every draft but accepts the probes
        drafter.observe(len(ids), accepted, path=[1] if accepted else [])
        rule.update(accepted, proposal.tree.n_drafted)
    first_zero = sent.index(0)
    first_probe = probes.index(True)
    assert first_probe == first_zero + PROBE_EVERY - 1 and sent[first_probe] == 1
    assert sent[first_zero:first_probe] == [0] * (PROBE_EVERY - 1)


def test_the_calibration_is_kept_per_match_length_at_each_step():
    from decoders.drafters.suffix import StepCalibration
    from decoders.drafters.suffix_tree import Candidate, Draft

    calibration = StepCalibration()
    short = Draft(match_len=1, nodes=[Candidate(40, -1, 1.0, 1, 1, 1), Candidate(41, 0, 1.0, 1, 1, 2)])
    long = Draft(match_len=12, nodes=[Candidate(7, -1, 0.5, 1, 2, 1), Candidate(8, -1, 0.5, 1, 2, 1),
                                      Candidate(9, 0, 0.5, 1, 1, 2)])
    for _ in range(5):
        calibration.observe(short, [])  # the first step missed: one tested step (a 1-token match), chance 1
        calibration.observe(long, [0, 2])  # two steps taken (chances 1 and 1), then no drafted child: untested
    assert calibration.rate(1) < 0.3 < 0.95 < calibration.rate(12) == calibration.rate(9)
    assert calibration.rate(2) == 0.6 and calibration.rate(3) == 0.7  # untouched classes keep their priors
    assert calibration.rate(6) == 0.8  # the priors rise with the match's length
    a1, a2 = calibration.rate(1), calibration.rate(2)  # the short draft's second step continues a 2-token match
    assert calibration.chances(short) == pytest.approx([a1, a1 * a2])
    a12 = calibration.rate(12)
    assert calibration.chances(long) == pytest.approx([0.5 * a12, 0.5 * a12, 0.5 * a12 ** 2])


def test_a_child_is_never_more_likely_than_its_parent_after_rounding():
    """Seen on a replayed edit prompt: 3 of 3 at every step and a rate just below 1 gave (c * 3) / 3 > c, the child
    sorted before its parent, and the round failed with 'parent 6 does not exist'."""
    from decoders.drafters.suffix import StepCalibration, _best_first
    from decoders.drafters.suffix_tree import Candidate, Draft

    calibration = StepCalibration()
    k = calibration.klass(8)
    calibration.taken[k], calibration.expected[k] = 0.9775429114615266, 1.0  # rate(8) = the value seen
    calibration.taken[k + 1] = calibration.expected[k + 1]  # rate(9 and up) = 1: every deeper step
    draft = Draft(match_len=8, nodes=[Candidate(10 + d, d - 1, 1.0, 3, 3, d + 1) for d in range(6)])
    chances = calibration.chances(draft)
    assert chances == sorted(chances, reverse=True) and chances[0] == 0.9775429114615266
    _best_first(draft, chances)
    assert [node.parent for node in draft.nodes] == [-1, 0, 1, 2, 3, 4]  # parents first: a tree prefix


def test_a_drafted_continuation_is_never_estimated_above_its_parent():
    """grow() multiplies counts down a path: (0.2 * 3) / 3 is 0.20000000000000004, above its parent's 0.2."""
    tree = SuffixTree(4)
    for seq in [[1, 2, 3]] * 3 + [[1, 4]] * 12:  # "1" 15 times, "1 2" 3 times, "1 2 3" 3 times
        tree.add(seq)
    draft = grow(tree.find([1]), 8, 0.0, 4, frozenset())
    prob = {node.token: node.prob for node in draft.nodes}
    assert prob[2] == 0.2 and prob[3] <= prob[2]


def _quiet_tiny_curve():
    """t(n)/t(1) of the tiny model as a quiet 2-core machine times it (about 2% more per doubling), tightly timed.
    The test below prices on this fixed curve: CI's own timing on a busy machine once read verification steep enough
    that the controller capped rounds at 7 (a timing, not a controller, failure)."""
    from decoders.costs import CostCurve

    step, chain = 0.002, {1: 1.0, 2: 1.02, 4: 1.04, 8: 1.08, 16: 1.16, 32: 1.32, 64: 1.64}
    spread = {n: (step * t * 0.99, step * t * 1.01) for n, t in chain.items()}
    return CostCurve("tiny", "float32", "packed", "cpu", tuple(chain), step, step, chain, dict(chain), spread=spread)


def test_the_cost_controller_keeps_long_rounds_where_drafts_are_accepted(tiny, monkeypatch):
    from decoders import costs

    curve = _quiet_tiny_curve()
    monkeypatch.setattr(costs, "for_run", lambda lm, prompt_tokens, path="dynamic": (curve, {"why": "fixed"}))
    answer = baseline_ids(tiny, REPEATING, 40)
    store = SuffixStore()
    store.add(answer)
    trace = generate(suffix(max_new_tokens=40, controller="cost"), REPEATING, target=tiny, store=store)
    assert trace.output_ids == answer
    assert max(r.n_accepted for r in trace.rounds) >= 8 and len(trace.rounds) <= 10
    for rnd in trace.rounds:
        sent = (rnd.search or {}).get("pool", [])[:rnd.n_drafted]
        chances = [entry["chance"] for entry in sent]
        assert chances == sorted(chances, reverse=True)  # best first by calibrated chance
        assert all(entry["parent"] < i for i, entry in enumerate(sent))  # every sent node's parent was sent too


# ---- the store, the options, the registry --------------------------------------------------------------------------

def test_the_store_is_bounded_first_in_first_out_and_its_tree_follows():
    store = SuffixStore(max_outputs=2, max_tokens=7)
    store.add([1, 2, 3], "a")
    tree = store.tree(4)
    store.add([4, 5], "b")
    store.add([6, 7, 8], "c")  # three outputs: the oldest goes
    assert [text for _, text in store.outputs] == ["b", "c"] and store.tokens == 5
    store.add([9, 9, 9], "d")  # 2 + 3 + 3 = 8 tokens > 7: "b" goes too
    assert [text for _, text in store.outputs] == ["c", "d"]
    assert tree_counts(tree) == substring_counts([[6, 7, 8], [9, 9, 9]], 4)  # the same tree, kept in step
    again = SuffixStore.from_dict(store.to_dict())
    assert again.outputs == store.outputs and tree_counts(again.tree(4)) == tree_counts(tree)
    store.clear()
    assert store.summary() == {"outputs": 0, "tokens": 0} and tree_counts(store.tree(4)) == Counter()


@pytest.mark.parametrize("fields, message", [
    (dict(suffix_depth=1), "suffix_depth must be a whole number from 2 to"),
    (dict(suffix_tokens=0), "suffix_tokens must be a whole number from 1 to"),
    (dict(suffix_factor=0.0), "suffix_factor must be above 0"),
    (dict(suffix_min_prob=1.5), "suffix_min_prob is a probability"),
    (dict(draft_model="smollm2-135m"), "draft_model only applies to drafter"),
])
def test_bad_settings_get_a_fix(fields, message):
    with pytest.raises(OptionsError, match=message):
        suffix(**fields).validate()


def test_one_class_and_one_registry_line():
    spec = registry.drafter("suffix")
    assert spec.family == registry.Family.TREE and not spec.offers_q and not registry.uses_draft_model(suffix())
    assert registry.label(suffix()) == "speculative · suffix tree (≤16 nodes, 2×match, p ≥ 0.1)"
    assert registry.label(suffix(controller="cost")).endswith("p ≥ 0.1) · cost-aware size")
    assert suffix().fields_in_use() >= {"suffix_depth", "suffix_tokens", "suffix_factor", "suffix_min_prob"}
    assert "controller" in suffix().fields_in_use()  # the cost controller prices the tree it sends
    suffix(controller="cost").validate()


def test_a_tree_drafter_must_say_its_depth_and_label():
    with pytest.raises(ValueError, match="needs depth= and nodes= .* and describe="):
        registry.DrafterSpec("tree-without-depth", registry.Family.TREE, "x", (), lambda ctx: None)


@pytest.mark.parametrize("kv_cache", ["static", "fixed"])
def test_preallocated_kv_buffers_reserve_the_suffix_tree_s_width(tiny, kv_cache):
    """A preallocated cache reserves the widest verification a tree drafter asks for (registry nodes=): suffix
    decoding's is suffix_tokens, not EAGLE's M. Here 24 different tokens followed the tail "1 2" in the store, so
    the first round sends 24 siblings with room for only 3 new tokens in the committed budget."""
    store = SuffixStore(max_outputs=64)
    for token in range(3, 40):
        store.add([1, 2, token])
    prompt = [5, 1, 2]
    options = suffix(max_new_tokens=3, suffix_tokens=24, suffix_factor=12.0, suffix_min_prob=0.0, tree_m=4,
                     kv_cache=kv_cache)
    trace = generate(options, prompt, target=tiny, store=store)
    assert trace.output_ids == baseline_ids(tiny, prompt, 3) and trace.rounds[0].n_drafted == 24


VOCAB_OF_THE_STORE = 40  # tokens the threads' outputs are drawn from: each add grows new branches near the root


def test_a_store_shared_by_threads_survives_adds_while_runs_draft_from_it():
    """API callers may share one store between threads: one adds outputs (evicting old ones, so the trees' dicts
    grow and shrink) while others' runs draft from it. A search walking a dict another thread changes used to fail
    mid-iteration ("dictionary changed size during iteration"); the store now holds still while a run searches."""
    import copy
    import sys
    import threading

    from decoders.drafters.suffix import Settings, SuffixDrafter

    draw = random.Random(0)
    outputs = [[draw.randrange(VOCAB_OF_THE_STORE) for _ in range(60)] for _ in range(40)]
    store = SuffixStore(max_outputs=3, max_tokens=10_000)
    for ids in outputs[:3]:
        store.add(ids)
    failures, done = [], threading.Event()

    def writer():
        try:
            for round_ in range(400):
                store.add(outputs[round_ % len(outputs)], text=str(round_))  # new branches, and old ones evicted
                if round_ % 97 == 96:
                    store.clear()
        except Exception as error:  # noqa: BLE001 - the test reports whatever broke
            failures.append(repr(error))
        finally:
            done.set()

    def reader(seed: int):
        rng = random.Random(seed)
        try:
            drafter = SuffixDrafter(Settings(depth=8, max_tokens=16, factor=4.0, min_prob=0.0), store=store)
            while not done.is_set():
                ids = [rng.randrange(VOCAB_OF_THE_STORE) for _ in range(3)]
                drafter.start(ids[:-1])
                drafter.propose(ids, 8, None, None, None, record=True)
                store.to_dict(), store.summary()
        except Exception as error:  # noqa: BLE001
            failures.append(repr(error))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the unlocked store broke within a few adds
    try:
        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(3)]
        threads.append(threading.Thread(target=writer))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(switch)
    assert not failures, failures[:3]
    kept = SuffixStore.from_dict(store.to_dict())
    assert tree_counts(kept.tree(8)) == tree_counts(store.tree(8))  # the trees kept in step with the outputs
    assert copy.deepcopy(store).to_dict() == store.to_dict()  # a session's copy gets a lock of its own
