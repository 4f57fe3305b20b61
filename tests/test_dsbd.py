"""DSBD: the width rule, one layer's exactness (chi-square vs exact enumeration), the forest forward, the loop."""
from __future__ import annotations

import itertools

import pytest
import torch

from decoders.beams import DsbdSettings, acceptance_count_distribution, choose_width
from decoders.beams.dsbd import dsbd, produced_beams, verify_layer
from decoders.beams.forest import Forest, forest_forward, keep_paths
from decoders.beams.state import BeamRows
from decoders.sampling import Warp
from chi_square import chi_square_pvalue
from tiny import noisy_copy, tiny_llama, tiny_qwen2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _pq(seed: int, n: int = 6, q_mass: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """A target joint P and a draft joint Q restricted to valid parents (total mass q_mass < 1)."""
    generator = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, generator=generator) * 1.5, 0)  # (n,)
    q = torch.softmax(torch.randn(n, generator=generator) * 1.5, 0) * q_mass  # (n,)
    return p, q


def _draws(q: torch.Tensor, width: int, generator: torch.Generator) -> list[int | None]:
    """i.i.d. draft draws over the full space: an index of q, or None (a parent that was not kept)."""
    full = torch.cat([q, (1 - q.sum()).clamp_min(0)[None]])  # (n+1,): the last cell is "invalid parent"
    picks = torch.multinomial(full, width, replacement=True, generator=generator).tolist()
    return [None if x == len(q) else x for x in picks]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_acceptance_count_distribution_sums_to_one(seed):
    p, q = _pq(seed)
    distribution = acceptance_count_distribution(p, q, 5)
    assert len(distribution) == 6 and abs(sum(distribution) - 1) < 1e-6 and min(distribution) >= 0


def test_p_equals_q_puts_all_mass_at_full_width():
    p, _ = _pq(3)
    distribution = acceptance_count_distribution(p, p, 4)
    assert distribution[4] == pytest.approx(1.0, abs=1e-6) and sum(distribution[:4]) == pytest.approx(0.0, abs=1e-6)
    assert choose_width(distribution, 0.99, 1) == 4


def test_chosen_width_is_monotone_in_thres():
    p, q = _pq(4)
    distribution = acceptance_count_distribution(p, q, 6)
    widths = [choose_width(distribution, t, 0) for t in (0.05, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.99)]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    assert choose_width(distribution, 0.999, 2) == 2  # the minimum width holds when the rule picks fewer


def test_acceptance_count_distribution_matches_simulation():
    """D[W] is the law of the number of accepted draws when all W drafts are tested."""
    p, q = _pq(5)
    width, generator = 4, torch.Generator().manual_seed(0)
    counts = torch.zeros(width + 1)
    for _ in range(4000):
        verdict = verify_layer(p, q, _draws(q, width, generator), width + 1, generator)  # never stops early
        counts[len(verdict.accepted)] += 1
    assert chi_square_pvalue(counts, torch.tensor(acceptance_count_distribution(p, q, width))) > 1e-3


def _first_two_beams(residual_fn=None, samples: int = 12000, close: bool = False) -> torch.Tensor:
    """Counts of (first, second) produced beam of one layer with K = 2 from W = 3 drafts. A far draft makes most
    layers fail (beams completed from the residual and P); a close one makes most pass (accepted drafts only)."""
    p, q = _pq(6, n=5, q_mass=0.7)
    if close:
        q = 0.85 * p + 0.1 * q  # (n,) mass 0.92, near P
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(5, 5)
    kwargs = {"residual_fn": residual_fn} if residual_fn else {}
    for _ in range(samples):
        draws = _draws(q, 3, generator)
        verdict = verify_layer(p, q, draws, 2, generator, **kwargs)
        first, second = produced_beams(verdict, draws, p, 3, generator)[:2]
        counts[first, second] += 1
    return counts, torch.outer(p, p)


@pytest.mark.parametrize("close", [False, True])
def test_one_layer_produces_independent_exact_draws_from_p(close):
    """Beam sampling draws two i.i.d. beams from P; a DSBD layer's first two beams have exactly that joint."""
    counts, exact = _first_two_beams(close=close)
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_a_mutated_residual_fails_the_exactness_test():
    """Keeping R = P after a rejection (no subtraction of Q) biases the beams toward Q; the test must see it."""
    counts, exact = _first_two_beams(residual_fn=lambda r, q: r)
    assert chi_square_pvalue(counts, exact) < 1e-6


def test_forest_forward_equals_direct_forwards_and_commit_keeps_the_path():
    lm = tiny_llama(vocab=32, seed=1)
    prompt = [3, 9, 4, 1]
    rows = BeamRows(lm.model)
    rows.prefill(prompt)
    rows.reorder([0, 0])  # two input beams with the same prefix and different pending tokens
    forest = Forest.roots([1, 7])
    forest.add_layer([0, 1, 0], [5, 6, 8])  # layer 1: two children of beam 0, one of beam 1
    forest.add_layer([2, 1, 0], [11, 12, 13])  # layer 2: parents index layer 1's drafts
    prefix = rows.length
    logits = forest_forward(rows, forest)  # (2, 4, V)
    paths = {(0, 0): prompt[:-1] + [1], (1, 0): prompt[:-1] + [7]}
    for level, (rws, cols) in enumerate(zip(forest.row, forest.col)):
        for j, (row, col) in enumerate(zip(rws, cols)):
            parent_col = forest.parents[row][col]
            paths[(row, col)] = paths[(row, parent_col)] + [forest.tokens[row][col]]
    with torch.no_grad():
        for (row, col), sequence in paths.items():
            direct = lm.model(torch.tensor([sequence])).logits[0, -1]
            assert torch.allclose(logits[row, col], direct, atol=1e-4), (row, col)
    # keep beam 0's path through draft 2 of layer 1 (row 0) and its child in layer 2, pending token 4
    columns = [0, forest.col[0][2], forest.col[1][0]]
    keep_paths(rows, prefix, [0], [columns])
    after = rows.step([4])[0]
    with torch.no_grad():
        direct = lm.model(torch.tensor([prompt[:-1] + [1, 8, 11, 4]])).logits[0, -1]
    assert torch.allclose(after, direct, atol=1e-4)


def _pair():
    target = tiny_llama(vocab=24, seed=2, scale=0.5)
    return target, noisy_copy(target, 0.1)


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_draft_equal_to_target_passes_every_layer_at_full_width(make):
    target = make(vocab=24, seed=2, scale=0.5)
    result = dsbd(target.model, target.model, [1, 2, 3], DsbdSettings(width=4, gamma=3), 16, set(), Warp(1.0),
                  torch.Generator().manual_seed(0))
    layers = [layer for step in result.steps for layer in step["layers"]]
    assert layers and all(layer["passed"] and layer["width"] == 4 and layer["accepted"] == 4 for layer in layers)
    assert all(step["stopped_at"] is None for step in result.steps) and len(result.tokens) == 16


def test_memory_mode_keeps_one_target_row_between_iterations():
    target, draft = _pair()
    result = dsbd(target.model, draft.model, [1, 2, 3], DsbdSettings(width=4, gamma=3, one_input_beam=True), 16,
                  set(), Warp(1.0), torch.Generator().manual_seed(0))
    assert [step["target_rows"] for step in result.steps] == [1] * len(result.steps)
    assert any(layer["width"] > 1 for step in result.steps for layer in step["layers"])  # beams branch inside
    wide = dsbd(target.model, draft.model, [1, 2, 3], DsbdSettings(width=4, gamma=3), 16, set(), Warp(1.0),
                torch.Generator().manual_seed(0))
    assert max(step["target_rows"] for step in wide.steps) == 4


@pytest.mark.parametrize("settings", [DsbdSettings(width=3, gamma=2), DsbdSettings(width=4, gamma=4, thres=0.9,
                                                                                       min_width=2)])
def test_dsbd_forest_records_are_consistent(settings):
    target, draft = _pair()
    result = dsbd(target.model, draft.model, [5, 6], settings, 12, {7}, Warp(1.0), torch.Generator().manual_seed(3))
    assert result.steps and result.candidates and len(result.tokens) <= 12
    for step in result.steps:
        n_roots = sum(1 for node in step["nodes"] if node["status"] == "root")
        for node in step["nodes"]:
            assert node["status"] in ("root", "accepted", "rejected", "not_reached")
            assert node["parent"] < node["id"] and (node["parent"] >= 0) == (node["layer"] > 0)
        drafted_layers = {node["layer"] for node in step["nodes"]} - {0}
        assert len(step["nodes"]) == n_roots + settings.width * len(drafted_layers)
        for layer in step["layers"]:
            assert abs(sum(layer["distribution"]) - 1) < 1e-6 and settings.min_width <= layer["width"] <= settings.width
        lengths = {len(beam["tokens"]) for beam in step["beams"]}
        assert len(lengths) <= 1  # every beam carried forward has the same length
        assert all(beam["tokens"][-1] == 7 for beam in step["ended"])
        assert all(7 not in beam["tokens"][:-1] for beam in step["beams"] + step["ended"])  # EOS ends a beam at once
    assert all(7 not in c.tokens[:-1] for c in result.candidates)


def test_dsbd_beams_that_draw_eos_leave_the_live_set():
    """With a frequent EOS, some beams end on a layer that passed; none of them is extended afterwards."""
    target, draft = _pair()
    eos = _common_token(target)
    ended = 0
    for seed in range(3):
        result = dsbd(target.model, draft.model, [5, 6], DsbdSettings(width=4, gamma=3), 12, {eos}, Warp(1.0),
                      torch.Generator().manual_seed(seed))
        ended += sum(len(step["ended"]) for step in result.steps)
        assert all(eos not in c.tokens[:-1] for c in result.candidates)
    assert ended > 0


def _common_token(lm) -> int:
    """The target's most likely token after the prompt [5, 6, x] for most x: a token that EOS-ends many beams."""
    with torch.no_grad():
        logits = lm.model(torch.tensor([[5, 6, x] for x in range(24)])).logits[:, -1]  # (24, V)
    return int(torch.softmax(logits, -1).mean(0).argmax())


def test_dsbd_drafts_with_the_registry_pairing():
    """DSBD needs a draft model: the registry's pairing by default (Qwen2.5-Coder 0.5B for 1.5B), a fix otherwise."""
    from decoders import DecodeOptions
    from decoders.api import draft_for
    from decoders.options import OptionsError

    assert draft_for(DecodeOptions(model="qwen2.5-coder-1.5b", method="dsbd", temperature=1.0)) == "qwen2.5-coder-0.5b"
    with pytest.raises(OptionsError, match="pass draft_model"):
        draft_for(DecodeOptions(model="smollm2-135m", method="dsbd", temperature=1.0))


class _HeldKV:
    """Every KV cache the models write into, and the most bytes all of them held at once right after a forward:
    what the process really held, whatever the decoder's own accounting says."""

    def __init__(self, *models):
        import weakref

        self.caches = weakref.WeakSet()
        self.peak = 0
        self.handles = [m.register_forward_hook(self._after, with_kwargs=True) for m in models]

    def _after(self, module, args, kwargs, output):
        from decoders.runtime import cache as kv

        if kwargs.get("past_key_values") is not None:
            self.caches.add(kwargs["past_key_values"])
        self.peak = max(self.peak, sum(kv.bytes_held(c) for c in list(self.caches)))

    def close(self):
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("one_input_beam", [True, False])
def test_dsbd_peak_kv_counts_everything_held_at_the_peak(one_input_beam):
    """The reported peak is what both models' caches held at once after the worst forward: the draft's layers and
    the target's scored forest included (the old accounting read the caches after compaction and missed both)."""
    target, draft = _pair()
    held = _HeldKV(target.model, draft.model)
    try:
        result = dsbd(target.model, draft.model, list(range(1, 20)), DsbdSettings(width=4, gamma=4,
                      one_input_beam=one_input_beam), 24, set(), Warp(1.0), torch.Generator().manual_seed(0))
    finally:
        held.close()
    after_iterations = max(sum(step["kv_bytes"].values()) for step in result.steps)
    assert held.peak > after_iterations  # the forest block and the draft layers really are held at some point
    assert result.peak_kv_bytes == held.peak


def test_dsbd_drafts_without_copying_the_draft_cache(monkeypatch):
    """The draft's layers grow in its own cache and are cropped off: no deep copy of the cache per iteration."""
    import copy

    target, draft = _pair()
    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda *a, **k: copies.append(1) or real(*a, **k))
    result = dsbd(target.model, draft.model, [1, 2, 3], DsbdSettings(width=4, gamma=3, one_input_beam=True), 12,
                  set(), Warp(1.0), torch.Generator().manual_seed(0))
    assert len(result.tokens) == 12 and not copies


def test_dsbd_draft_forest_logits_equal_direct_forwards():
    """Layer ℓ's draft logits from the forest in the draft cache equal a plain forward over each draft's path."""
    from decoders.beams.forest import draft_forest_layer

    lm = tiny_llama(vocab=32, seed=1)
    prompt = [3, 9, 4, 1]
    rows = BeamRows(lm.model)
    rows.prefill(prompt)
    rows.reorder([0, 0])
    start = rows.length
    block = [[-1], [-1]]
    draft_forest_layer(rows, start, block, [(0, 0), (1, 0)], [1, 7])
    block[0] += [0, 0]  # two children of row 0's root, none of row 1's: row 1 gets two padding columns
    logits = draft_forest_layer(rows, start, block, [(0, 1), (0, 2)], [5, 6])  # (2, V)
    block[0].append(1)  # a grandchild under (0, 1); row 1 pads again
    deeper = draft_forest_layer(rows, start, block, [(0, 3)], [11])  # (1, V)
    with torch.no_grad():
        for got, path in ((logits[0], [1, 5]), (logits[1], [1, 6]), (deeper[0], [1, 5, 11])):
            direct = lm.model(torch.tensor([prompt[:-1] + path])).logits[0, -1]
            assert torch.allclose(got, direct, atol=1e-4), path
    rows.crop(start)
    assert rows.length == start and rows.rows == 2
