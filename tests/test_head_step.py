"""The EAGLE head's fixed-shape level step (decoders/drafters/head_step.py, issue 46).

On the CPU: each level's step over the fixed buffer gives the logits and features of the step it replaced (a
DynamicCache the frontier was appended to, the mask cut to context + fed + F), reads and uploads nothing, and keeps
the committed prefix when a growable buffer doubles; with CUDA graphs emulated (tests/test_graphs.py's fixture) a run
captures and replays the head's levels, leases them back the next run, and frees the head once nobody holds it.
On a GPU (skipped with the reason on a CPU): replayed level graphs give the eager step's outputs, and an EAGLE-head
run with cuda_graphs replays them and decodes the baseline's tokens.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from host_reads import HostReads, reads
from kv_helpers import PROMPTS, drafter_pair, options_for
from test_graphs import emulated_graphs, gpu_pair  # noqa: F401  (fixtures)

from decoders import DecodeOptions, generate
from decoders.drafters.device_tree import grow_on_device
from decoders.drafters.head_step import HeadSteps, full_vocab
from decoders.drafters.tree_draft import TreeShape, draft_log_probs, grow
from decoders.runtime import cache as kv
from decoders.sampling import Warp

SHAPES = {"eagle2": TreeShape(k=3, steps=4, m=10), "ddd": TreeShape.ddd(k=3, m=12, checks=(), threshold=-1.0,
                                                                         steps=5, width=4)}


@pytest.fixture(scope="module")
def head():
    from tiny import tiny_llama

    from decoders.eagle.head import EagleHead

    target = tiny_llama(seed=5, layers=2)
    torch.manual_seed(0)
    return EagleHead(target.model)


def _context(head, caches, n: int = 9):
    """Feed n committed pairs into every cache; the root's guessed feature (d,) and log q (V,)."""
    torch.manual_seed(1)
    device = next(head.parameters()).device
    tokens = torch.randint(1, head.config.vocab_size, (1, n)).to(device)  # (1, n)
    feats = torch.randn(1, n, head.config.hidden_size).to(device)  # (1, n, d)
    with torch.inference_mode():
        for cache in caches:
            hidden, logits = head(tokens, feats, cache=cache)  # (1, n, d), (1, n, V)
    return hidden[0, -1], full_vocab(head, draft_log_probs(logits[0, -1], Warp(0.0)))


def _replaced_step(head, cache, frontier, previous, context: int, warp: Warp):
    """The step before issue 46's fixed buffer: the frontier appended to a DynamicCache, mask (F, L+F) on the host."""
    mask = frontier.mask(context, previous.dtype)  # (F, context + fed + F)
    positions = torch.full((1, frontier.size), context - 1 + frontier.depth)  # (1, F)
    with torch.inference_mode():
        hidden, logits = head(frontier.tokens[None], previous[frontier.rows][None], position_ids=positions,
                              cache=cache, attention_mask=mask[None, None])  # (1, F, d), (1, F, V)
    return hidden[0], full_vocab(head, draft_log_probs(logits[0], warp))


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_level_step_gives_the_replaced_steps_outputs(head, name, temperature):
    shape, warp = SHAPES[name], Warp(temperature)
    dynamic, steps = kv.new_cache(head), HeadSteps(head, 64)
    root_hidden, root_logq = _context(head, [dynamic, steps.cache])
    last, levels = [root_hidden[None]], []

    def expand(frontier):
        want_hidden, want_logq = _replaced_step(head, dynamic, frontier, last[0], 9, warp)
        got_hidden, got_logq = steps.step(frontier, last[0], warp)
        torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_logq, want_logq, rtol=1e-5, atol=1e-5)
        levels.append((frontier.size, frontier.fed))
        last[0] = got_hidden
        return got_logq

    grow_on_device(root_logq, expand, shape, shape.steps)
    assert len(levels) == shape.steps - 1 and steps.length == 9  # the frontiers' pairs were never counted valid
    assert levels[-1][1] == sum(size for size, _ in levels[:-1])  # fed: every earlier level's slots


def test_feeding_committed_pairs_gives_the_dynamic_caches_outputs(head):
    """The catch-up at one shape per count over the whole buffer: the outputs of the head's causal forward appended
    to a DynamicCache, and the pairs counted valid."""
    dynamic, steps = kv.new_cache(head), HeadSteps(head, 64)
    _context(head, [dynamic, steps.cache])
    torch.manual_seed(2)
    for n in (1, 4, 1, 3):
        tokens = torch.randint(1, head.config.vocab_size, (n,))  # (n,)
        feats = torch.randn(n, head.config.hidden_size)  # (n, d)
        with torch.inference_mode():
            want_hidden, want_logits = head(tokens[None], feats[None], cache=dynamic)  # (1, n, d), (1, n, V)
        hidden, logits = steps.feed(tokens, feats)  # (d,), (V,)
        torch.testing.assert_close(hidden, want_hidden[0, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, want_logits[0, -1], rtol=1e-5, atol=1e-5)
        assert steps.length == kv.length(dynamic)


def test_a_level_step_reads_and_uploads_nothing(head):
    shape = SHAPES["ddd"]
    steps = HeadSteps(head, 64)
    root_hidden, root_logq = _context(head, [steps.cache])
    last, counter = [root_hidden[None]], HostReads()

    def expand(frontier):
        with counter.active():
            last[0], logq = steps.step(frontier, last[0], Warp(0.0))
        return logq

    grow_on_device(root_logq, expand, shape, shape.steps)
    counts = counter.take()
    assert (reads(counts), reads(counts, kind="upload")) == (0, 0), counts


@pytest.mark.parametrize("shape", [SHAPES["ddd"], TreeShape.static()], ids=["ddd", "static"])
def test_a_round_of_level_steps_creates_no_tensor_off_the_heads_device(head, shape):
    """tests/test_buffers.py's CPU guard: inside torch.device("meta") a tensor made without device= lands on the meta
    device and mixing it with the head's raises, as it would fail on a GPU."""
    want, got = HeadSteps(head, 64), HeadSteps(head, 64)
    root_hidden, root_logq = _context(head, [want.cache, got.cache])
    grown = []
    for steps, place in ((want, None), (got, "meta")):
        last = [root_hidden[None]]

        def expand(frontier):
            last[0], logq = steps.step(frontier, last[0], Warp(0.0))
            return logq

        with torch.device(place) if place else torch.device("cpu"):
            growth = grow(root_logq, expand, shape, shape.steps)
        grown.append(torch.cat(growth.tokens))
    assert torch.equal(*grown)


def test_a_growable_buffer_doubles_and_keeps_the_committed_pairs(head):
    small, big = HeadSteps(head, 12, growable=True), HeadSteps(head, 64)
    _context(head, [small.cache, big.cache])
    small.make_room(40)
    assert small.cache.capacity == 40 and small.length == 9
    for mine, want in zip(small.cache.layers, big.cache.layers):
        assert torch.equal(mine.keys[:, :, :9], want.keys[:, :, :9])
    with pytest.raises(Exception, match="plan gave 64"):
        big.make_room(65)


# ---------------------------------------------------------------- graphs: emulated on the CPU, real on a GPU

@pytest.fixture(scope="module")
def cpu_heads(tmp_path_factory):
    return drafter_pair(tmp_path_factory.mktemp("head-steps"))


@pytest.mark.parametrize("name", ["eagle2 head", "ddd head"])
def test_with_graphs_a_run_captures_and_replays_the_heads_levels(cpu_heads, emulated_graphs, monkeypatch, name):
    from decoders.drafters import device_tree

    monkeypatch.setattr(device_tree, "STOPS_READ_ON", frozenset())  # DDD as on a GPU: its levels run past a stop
    options = options_for(name, cpu_heads, kv_cache="fixed")
    eager = generate(options, PROMPTS["long"], target=cpu_heads["target"])
    assert eager.runtime["draft"]["graph"] == 0 and eager.runtime["draft"]["eager"] > 0, eager.runtime
    trace = generate(replace(options, cuda_graphs=True), PROMPTS["long"], target=cpu_heads["target"])
    assert trace.output_ids == eager.output_ids, name
    draft = trace.runtime["draft"]
    assert draft["graph"] > draft["eager"] and draft["captured"] and draft["capacity"] == 256, draft


def test_kept_steps_are_leased_again_and_the_head_is_freed_once_nobody_holds_it(emulated_graphs):
    import gc
    import weakref

    from tiny import tiny_llama

    from decoders.drafters.head_step import lease_steps
    from decoders.eagle.head import EagleHead
    from decoders.runtime.graphs import give_back

    head = EagleHead(tiny_llama(layers=1, seed=3).model)
    steps = lease_steps(head, 64)
    assert lease_steps(head, 64) is not steps  # leased: a second drafter of the same head gets its own
    root_hidden, root_logq = _context(head, [steps.cache])
    last = [root_hidden[None]]

    def expand(frontier):
        last[0], logq = steps.step(frontier, last[0], Warp(0.0))
        return logq

    steps.feed(torch.tensor([4, 5, 6]), torch.randn(3, head.config.hidden_size))  # a shape used once: no graph
    for _ in range(2):  # the second round captures
        grow_on_device(root_logq, expand, SHAPES["eagle2"], 3)
    assert any(level.graph is not None for level in steps.levels.values()) and ("feed", 3) in steps.levels
    give_back(steps)
    assert lease_steps(head, 64) is steps and steps.length == 0  # given back: the next run's, emptied
    assert steps.levels and all(level.graph is not None for level in steps.levels.values())  # graphs kept only
    give_back(steps)
    gone = weakref.ref(head)
    del head, steps, last, expand
    gc.collect()
    assert gone() is None


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA graphs need one")


@needs_cuda
@pytest.mark.parametrize("name", list(SHAPES))
def test_replayed_level_graphs_give_the_eager_steps_outputs(name):
    from tiny import tiny_llama

    from decoders.eagle.head import EagleHead

    target = tiny_llama(seed=5, layers=2).model.to("cuda")
    torch.manual_seed(0)
    head = EagleHead(target)
    shape = SHAPES[name]
    captured, eager = HeadSteps(head, 256, graphs=True), HeadSteps(head, 256)
    root_hidden, root_logq = _context(head, [captured.cache, eager.cache])
    for round_ in range(3):  # the catch-up of two pairs: eager, then captured and replayed
        device = next(head.parameters()).device
        tokens, feats = torch.tensor([3 + round_, 5]).to(device), torch.randn(2, head.config.hidden_size).to(device)
        for got, want in zip(captured.feed(tokens, feats), eager.feed(tokens, feats)):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for round_ in range(3):  # round 0 eager (first use), round 1 captures and replays, round 2 replays
        last = [root_hidden[None]] * 2

        def expand(frontier):
            got, logq = captured.step(frontier, last[0], Warp(0.0))
            want, want_logq = eager.step(frontier, last[1], Warp(0.0))
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            torch.testing.assert_close(logq, want_logq, rtol=0, atol=1e-5)
            last[:] = [got.clone(), want]
            return want_logq

        grow_on_device(root_logq, expand, shape, shape.steps)
    assert captured.counts["graph"] == 2 + 2 * (shape.steps - 1) and captured.summary()["captured"]


@needs_cuda
@pytest.mark.parametrize("name", ["eagle2 head", "ddd head"])
def test_an_eagle_head_run_with_graphs_replays_the_levels_and_decodes_the_baseline(gpu_pair, name):  # noqa: F811
    for prompt in PROMPTS.values():
        baseline = generate(DecodeOptions(max_new_tokens=30, kv_cache="dynamic"), prompt, target=gpu_pair["target"])
        trace = generate(options_for(name, gpu_pair, cuda_graphs=True), prompt, target=gpu_pair["target"])
        assert trace.output_ids == baseline.output_ids, name
        assert trace.runtime["draft"]["graph"] > 0, trace.runtime


def test_observe_keeps_the_accepted_rows_as_views_of_the_verifiers_features(head):
    """A list index copies the list to the device (an upload the counter does not see); rows taken by int are
    views, and the next catch-up gathers them on the device."""
    from decoders.drafters import EagleTreeDrafter

    drafter = EagleTreeDrafter(head, SHAPES["eagle2"])
    features = torch.randn(6, head.config.hidden_size)  # (N+1, d) from the verifying forward
    drafter.observe(10, 2, path=[2, 5, 1], features=features)
    assert [torch.equal(row, features[i]) for row, i in zip(drafter.known, (0, 2, 5))] == [True] * 3
    assert len(drafter.known) == 3
    assert all(row.untyped_storage().data_ptr() == features.untyped_storage().data_ptr() for row in drafter.known)
