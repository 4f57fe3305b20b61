"""The streaming loop: one yield per round, early stop frees everything, budgets are exact."""
from __future__ import annotations

import pytest

from decoders import DecodeOptions, stream
from decoders.runtime.runner import decoder_layers


def test_stream_yields_once_per_round(tiny, drafts):
    options = DecodeOptions(method="speculative", rule="static", gamma=3, max_new_tokens=20)
    seen = [len(t.rounds) for t in stream(options, [1, 2, 3], target=tiny, draft=drafts["noisy"])]
    assert seen == list(range(1, len(seen) + 1)) and len(seen) > 1


def test_closing_the_stream_restores_layers_and_frees_caches(tiny):
    layers_before = list(decoder_layers(tiny.model))
    options = DecodeOptions(method="speculative", drafter="layer-skip", skip_layers=(1, 2), max_new_tokens=30)
    live = stream(options, [1, 2, 3, 4], target=tiny)
    trace = next(live)
    assert trace.rounds and trace.stop_reason == ""
    live.close()  # what a Stop button does
    assert trace.stop_reason == "cancelled" and trace.totals["tokens"] == len(trace.output_ids)
    assert list(decoder_layers(tiny.model)) == layers_before


def test_draft_cache_is_freed_on_cancel(tiny, drafts, monkeypatch):
    from decoders.drafters import DraftModelDrafter

    closed = []
    original = DraftModelDrafter.close
    monkeypatch.setattr(DraftModelDrafter, "close", lambda self: (closed.append(True), original(self)))
    live = stream(DecodeOptions(method="speculative", max_new_tokens=30), [1, 2, 3], target=tiny,
                  draft=drafts["noisy"])
    next(live)
    live.close()
    assert closed == [True]


def test_error_inside_a_draft_restores_layers(tiny, monkeypatch):
    from decoders.drafters import base

    layers_before = list(decoder_layers(tiny.model))

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(base, "sample", broken)
    monkeypatch.setattr(base, "draw", broken)  # a chain on the device draws without reading (issue 46)
    options = DecodeOptions(method="speculative", drafter="layer-skip", temperature=1.0, max_new_tokens=5)
    with pytest.raises(RuntimeError, match="boom"):
        list(stream(options, [1, 2, 3], target=tiny))
    assert list(decoder_layers(tiny.model)) == layers_before


def test_a_drafter_whose_close_raises_still_releases_the_target(tiny, drafts, monkeypatch):
    """The target's release runs even when the drafter's close fails (with graphs, a runner that is never released
    keeps its model's kept buffers leased for good), and the drafter's error still surfaces."""
    from decoders.drafters import DraftModelDrafter
    from decoders.runtime.runner import CachedModel

    def broken(self):
        raise RuntimeError("close failed")

    released = []
    original = CachedModel.release
    monkeypatch.setattr(DraftModelDrafter, "close", broken)
    monkeypatch.setattr(CachedModel, "release", lambda self: (released.append(self.model), original(self)))
    options = DecodeOptions(method="speculative", rule="static", gamma=2, max_new_tokens=4)
    with pytest.raises(RuntimeError, match="close failed"):
        list(stream(options, [1, 2, 3], target=tiny, draft=drafts["noisy"]))
    assert any(model is tiny.model for model in released)


@pytest.mark.parametrize("budget", [1, 2, 3, 9])
def test_budget_is_exact_even_when_everything_is_accepted(tiny, budget):
    options = DecodeOptions(method="speculative", rule="static", gamma=8, max_new_tokens=budget)
    trace = list(stream(options, [5, 6], target=tiny, draft=tiny))[-1]
    assert len(trace.output_ids) == budget and trace.stop_reason == "max_new_tokens"
    assert all(r.n_drafted <= budget - 1 for r in trace.rounds)


def test_time_the_consumer_holds_a_round_is_not_decode_time(tiny):
    import time

    start = time.perf_counter()
    for trace in stream(DecodeOptions(max_new_tokens=4), [1, 2, 3], target=tiny):
        time.sleep(0.25)  # a slow renderer
    wall = time.perf_counter() - start
    assert wall > 1.0  # four rounds were held for 0.25 s each
    assert trace.decode_seconds < wall - 0.9
    assert sum(sum(r.seconds.values()) for r in trace.rounds) < wall - 0.9


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_round_goes_through_the_one_verify(tiny, drafts, monkeypatch, temperature):
    """The loop decides acceptance through verify.verify only (one dispatch, greedy and sampled alike)."""
    from decoders import loop
    from decoders import verify as core

    calls = []

    def spy(tree, logits, p, generator, argmax=None):
        calls.append(p is None)
        return core.verify(tree, logits, p, generator, argmax)

    monkeypatch.setattr(loop, "verify", spy)
    options = DecodeOptions(method="speculative", rule="static", gamma=3, max_new_tokens=20, temperature=temperature)
    trace = list(stream(options, [1, 2, 3], target=tiny, draft=drafts["noisy"]))[-1]
    assert calls == [temperature == 0.0] * len(trace.rounds)


def test_verify_dispatches_on_whether_p_is_given():
    import torch

    from decoders import verify as core
    from decoders.tree import DraftTree

    tree = DraftTree.root_only(0)
    tree.add(0, 2)
    logits = torch.tensor([[0.0, 0.0, 5.0], [9.0, 0.0, 0.0]])  # (2, V): argmax 2 after the root, then 0
    greedy = core.verify(tree, logits, None, torch.Generator().manual_seed(0))
    assert (greedy.path, greedy.token, greedy.checks[0].uniform) == ([1], 0, None)
    tree.q_dists[0] = torch.tensor([0.0, 0.0, 1.0])
    p = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])  # (2, V): accept 2 for sure, then the bonus is 1
    sampled = core.verify(tree, logits, p, torch.Generator().manual_seed(0))
    assert (sampled.path, sampled.token) == ([1], 1) and sampled.checks[0].uniform is not None


def _kv_bytes(model, positions: int) -> int:
    """One sequence's KV cache over `positions` positions, from the config: 2 (K, V) x layers x heads x dim x 4."""
    c = model.config
    heads = c.num_key_value_heads or c.num_attention_heads
    return 2 * c.num_hidden_layers * heads * (c.hidden_size // c.num_attention_heads) * positions * 4


def test_peak_kv_memory_is_measured_from_the_caches(tiny, drafts):
    from decoders import generate

    prompt = [3, 9, 4, 1, 7]
    base = generate(DecodeOptions(max_new_tokens=12), prompt, target=tiny)
    # the baseline's cache ends holding the prompt and every output token but the last (still pending)
    assert base.totals["peak_kv_bytes"] == _kv_bytes(tiny.model, len(prompt) - 1 + 12)
    chain = generate(DecodeOptions(method="speculative", drafter="draft-model", gamma=4, max_new_tokens=12), prompt,
                     target=tiny, draft=drafts["noisy"])
    tree = generate(DecodeOptions(method="speculative", drafter="eagle2", tree_k=4, tree_depth=4, tree_m=20,
                                  max_new_tokens=12), prompt, target=tiny, draft=drafts["noisy"])
    # drafts sit in both caches before verification: the target's peak holds a round's drafts, plus the draft's own
    assert chain.totals["peak_kv_bytes"] > base.totals["peak_kv_bytes"] + _kv_bytes(drafts["noisy"].model, 4)
    assert tree.totals["peak_kv_bytes"] > chain.totals["peak_kv_bytes"]  # 20 tree nodes verified at once
