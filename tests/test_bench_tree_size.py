"""bench/tree_size.py: one EAGLE-2 run at a large M and depth predicts every smaller (D, M)'s accepted length
exactly (checked against real runs at the smaller shape on tiny models), and the prediction weighs it against the
measured t(n) and the growth's cost."""
from __future__ import annotations

import pytest

from bench import tree_size
from decoders import DecodeOptions, generate

PROMPTS = [[7], [3, 9, 4, 1, 7, 22, 5], [11, 2, 2, 40]]


def _eagle2(m: int, max_new_tokens: int, depth: int = 4) -> DecodeOptions:
    return DecodeOptions(model="tiny", method="speculative", drafter="eagle2", tree_k=3, tree_depth=depth, tree_m=m,
                         max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("small", [1, 3, 6])
def test_a_large_tree_s_ranks_give_a_smaller_tree_s_first_round_exactly(tiny, drafts, small):
    """The first round starts from the same state at every M, so its accepted length at M = small must equal the
    count of the large run's accepted-path ranks <= small."""
    for draft in (drafts["noisy"], drafts["same"]):
        for prompt in PROMPTS:
            large = generate(_eagle2(20, 12), prompt, target=tiny, draft=draft)
            ranks = tree_size.accepted_ranks(large)
            assert len(ranks) == len([r for r in large.rounds if r.search])
            assert all(len(r) == n.n_accepted for r, n in zip(ranks, [r for r in large.rounds if r.search]))
            first = generate(_eagle2(small, 12), prompt, target=tiny, draft=draft).rounds[0]
            assert first.n_accepted == sum(rank <= small for rank in ranks[0])


def test_the_draft_is_the_target_so_every_path_node_ranks_first():
    """Sanity of the ranks' meaning: accepted ranks are distinct and start from the top of the pool."""
    from tiny import tiny_llama

    model = tiny_llama(layers=2)
    trace = generate(_eagle2(10, 8), [5, 6], target=model, draft=model)
    for ranks in tree_size.accepted_ranks(trace):
        assert ranks == sorted(set(ranks)) and (not ranks or ranks[0] == 1)


def test_the_prediction_trades_accepted_tokens_against_t_of_n():
    curve = {"t": {"1": 1.0, "3": 1.2, "5": 2.0, "9": 5.0}}
    ranks = [[1, 2, 4], [1], [1, 2]]  # rounds: accepted-path value ranks at the largest M
    rows = tree_size.predict(ranks, fixed_seconds=0.5, t1_seconds=1.0, curve=curve, candidates=(2, 4, 8, 64))
    assert [r["m"] for r in rows] == [2, 4, 8]  # t(65) is beyond the curve: no prediction
    m2, m4, m8 = rows
    assert m2["tokens_per_round"] == pytest.approx(1 + (2 + 1 + 2) / 3)
    assert m4["tokens_per_round"] == m8["tokens_per_round"] == pytest.approx(1 + (3 + 1 + 2) / 3)
    assert m2["seconds_per_round"] == pytest.approx(0.5 + 1.2) and m8["seconds_per_round"] == pytest.approx(5.5)
    assert m2["speedup"] == pytest.approx((8 / 3) / 1.7)
    assert tree_size.pick(rows)["m"] == 2  # M 4 accepts more but t(5) costs more than it buys
    flat = {"t": {"1": 1.0, "3": 1.0, "5": 1.0, "9": 1.0}}  # a GPU-like curve: bigger never costs more
    assert tree_size.pick(tree_size.predict(ranks, 0.5, 1.0, flat, (2, 4, 8)))["m"] == 4


@pytest.mark.parametrize("depth,small", [(1, 2), (2, 1), (2, 4), (3, 3)])
def test_a_deep_tree_s_ranks_give_a_shallower_tree_s_first_round_exactly(tiny, drafts, depth, small):
    """A shallower tree's pool is the deeper tree's first steps, so its first round's accepted length must equal the
    count of the deep run's accepted nodes from steps <= depth ranked <= small among those steps' nodes."""
    checked = 0
    for draft in (drafts["noisy"], drafts["same"]):
        for prompt in PROMPTS:
            deep = generate(_eagle2(40, 12, depth=5), prompt, target=tiny, draft=draft)
            first = generate(_eagle2(small, 12, depth=depth), prompt, target=tiny, draft=draft).rounds[0]
            assert first.n_accepted == sum(rank <= small for rank in tree_size.accepted_ranks(deep, depth)[0])
            checked += first.n_accepted
    assert checked > 0  # the drafts agree with the target sometimes, so the counts are not all trivially zero


def test_growth_scales_with_depth_and_sizes_beyond_the_pool_are_skipped():
    curve = {"t": {str(n): 1.0 + n / 10 for n in range(1, 70)}}
    ranks = [[1, 2], [1]]
    rows = tree_size.predict(ranks, 0.2, 1.0, curve, (2, 4, 8, 59), k=2, depth=2)
    assert [r["m"] for r in rows] == [2, 4]  # K 2, D 2: a pool of 2 + 2 * 4 = 6 nodes
    assert tree_size.pool_size(10, 6) == 510 and tree_size.pool_size(2, 1) == 2
    grid = tree_size.predict_grid({2: []}, {2: 0.05}, (3,), 1.0, curve, (4,))
    assert grid == []  # no rounds, no prediction


def test_the_measured_set_is_the_best_predicted_then_the_paper_once():
    rows = [{"k": 4, "depth": 3, "m": 8, "tok_s": 3.0}, {"k": 2, "depth": 4, "m": 4, "tok_s": 5.0},
            {"k": 10, "depth": 6, "m": 59, "tok_s": 4.0}, {"k": 4, "depth": 6, "m": 16, "tok_s": 1.0}]
    assert tree_size.to_measure(rows, 2) == [(2, 4, 4), (10, 6, 59)]
    assert tree_size.to_measure(rows, 3) == [(2, 4, 4), (10, 6, 59), (4, 3, 8)]
    assert tree_size.pick(rows)["k"] == 2


def test_the_table_marks_the_pick_the_paper_and_the_chain():
    def row(k, d, m, speedup):
        return {"k": k, "depth": d, "m": m, "growth_s": 0.05, "t_verify": 1.5, "tokens_per_round": 2.0,
                "tok_s": speedup, "speedup": speedup}
    result = {"settings": {"target": "t", "dtype": "float32", "grower": "draft model", "command": "x",
                           "tuning_prompts": 2, "prompts": 3, "reps": 1, "max_new_tokens": 8, "ks": [2, 10],
                           "depths": [3, 6], "threads": 2, "machine": "m", "minutes": 1.0, "t1_ms": 10.0},
              "predicted": [row(2, 3, 4, 1.1), row(2, 3, 8, 1.0), row(10, 6, 59, 0.5), row(10, 6, 8, 0.9),
                            row(10, 3, 4, 0.8), row(2, 6, 8, 0.95)],
              "picked": [2, 3, 4], "chain": {"label": "chain γ", "speedup": 1.6},
              "measured": [{"shape": [2, 3, 4], "speedup": 1.05, "tau": 1.8, "identical": "3/3"},
                           {"shape": [10, 6, 59], "speedup": 0.4, "tau": 2.1, "identical": "3/3"}]}
    table = tree_size.markdown(result)
    assert "| 2 | 3 | 4 **(picked)** | 50 ms | 1.50 | 2.00 | 1.10× | 1.05× |" in table
    assert "| 10 | 6 | 59 (paper) |" in table and "| 2 | 3 | 8 |" not in table  # not (K, D)'s best, not measured
    assert table.index("| 2 | 6 | 8 |") < table.index("| 10 | 6 | 8 |")  # best predicted first
    assert "the measured best was K 2, D 3, M 4 (1.05×)" in table
    assert "chain γ: 1.60×; the best measured tree ÷ the chain = 0.66×." in table
