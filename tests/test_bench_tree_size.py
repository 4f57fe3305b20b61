"""bench/tree_size.py: one EAGLE-2 run at a large M predicts every smaller M's accepted length exactly (checked
against real runs at the smaller M on tiny models), and the prediction weighs it against the measured t(n)."""
from __future__ import annotations

import pytest

from bench import tree_size
from decoders import DecodeOptions, generate

PROMPTS = [[7], [3, 9, 4, 1, 7, 22, 5], [11, 2, 2, 40]]


def _eagle2(m: int, max_new_tokens: int) -> DecodeOptions:
    return DecodeOptions(model="tiny", method="speculative", drafter="eagle2", tree_k=3, tree_depth=4, tree_m=m,
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
    assert tree_size.pick(rows) == 2  # M 4 accepts more but t(5) costs more than it buys
    flat = {"t": {"1": 1.0, "3": 1.0, "5": 1.0, "9": 1.0}}  # a GPU-like curve: bigger never costs more
    assert tree_size.pick(tree_size.predict(ranks, 0.5, 1.0, flat, (2, 4, 8))) == 4


def test_the_table_marks_the_pick_and_the_measured_best():
    result = {"settings": {"target": "t", "dtype": "float32", "grower": "draft model", "command": "x",
                           "tuning_prompts": 2, "prompts": 3, "reps": 1, "max_new_tokens": 8, "k": 3, "depth": 4,
                           "threads": 2, "machine": "m", "minutes": 1.0, "t1_ms": 10.0, "fixed_ms": 2.0},
              "predicted": [{"m": 2, "t_verify": 1.2, "tokens_per_round": 2.0, "speedup": 1.1},
                            {"m": 4, "t_verify": 2.0, "tokens_per_round": 2.3, "speedup": 0.9}],
              "picked": 2, "measured": [{"m": 2, "speedup": 1.05, "tau": 1.8, "identical": "3/3"},
                                        {"m": 4, "speedup": 1.2, "tau": 2.1, "identical": "3/3"}]}
    table = tree_size.markdown(result)
    assert "| 2 **(picked)** | 1.20 | 2.00 | 1.10× | 1.05× |" in table
    assert "Picked M = 2 (predicted); the measured best was M = 4 (1.20×)." in table
