"""Static KV buffers (issue 32, part 1): every method decodes the same tokens with a preallocated buffer as with
transformers' DynamicCache, greedy and sampled with the same seed; tree compaction and rollback are index moves
inside the buffer; a run can fill its buffer to the last slot and one token more fails clearly.

Both buffer readings run here on the CPU: "static" (growing views) and "fixed" (the whole buffer at bucketed widths,
padding masked: exactly what a captured CUDA graph replays; tests/test_graphs.py checks the replay itself on a GPU).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kv_helpers import LENGTH, METHODS, PROMPTS, TREE, drafter_pair, options_for

from decoders import DecodeOptions, OptionsError, generate
from decoders.runtime.buffers import BUCKETS, BufferFull, BufferLayer, KVPlan
from decoders.runtime.runner import CachedModel
from decoders.tree import DraftTree

BUFFERS = ("static", "fixed")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return drafter_pair(tmp_path_factory.mktemp("drafters"))


_REFERENCE: dict[tuple, list[int]] = {}


def dynamic_ids(name: str, pair, prompt: str, temperature: float) -> list[int]:
    key = (name, prompt, temperature)
    if key not in _REFERENCE:
        options = options_for(name, pair, kv_cache="dynamic", temperature=temperature, seed=3)
        _REFERENCE[key] = generate(options, PROMPTS[prompt], target=pair["target"], draft=pair["draft"]).output_ids
    return _REFERENCE[key]


@pytest.mark.parametrize("kind", BUFFERS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_decodes_the_same_tokens_as_with_a_dynamic_cache(pair, name, temperature, kind):
    for prompt in PROMPTS:
        options = options_for(name, pair, kv_cache=kind, temperature=temperature, seed=3)
        trace = generate(options, PROMPTS[prompt], target=pair["target"], draft=pair["draft"])
        assert trace.output_ids == dynamic_ids(name, pair, prompt, temperature), (name, kind, prompt)
        target = trace.runtime["target"]
        assert target["kv_cache"] == kind and target["capacity"] >= len(PROMPTS[prompt]) + LENGTH
        if kind == "fixed":  # every target forward ran at a bucketed width (the prefill of 19 tokens at 32)
            assert set(target["widths"]) <= set(BUCKETS) and target["graph"] == 0
            if name != "layer skip":  # its drafts run target layers too (early exit's verification counts here)
                assert target["eager"] == len(trace.rounds) + 1
        if "draft" in trace.runtime:  # a draft model's own cache is a buffer of the same kind; an EAGLE head's is
            # its fixed buffer whatever the plan (decoders/drafters/head_step.py)
            assert trace.runtime["draft"]["kv_cache"] == ("fixed" if "head" in name else kind)
    if name != "baseline" and temperature > 0:  # rejections happened, so rollback and resampling ran
        assert trace.totals["accepted"] < trace.totals["drafted"]


@pytest.mark.parametrize("kind", BUFFERS)
# Not the trees (their masks are built on the CPU on purpose, decoders/tree.py) nor the heads (loaded from disk):
# neither runs under meta, with any cache.
@pytest.mark.parametrize("name", ["draft model, AdaEDL", "prompt lookup", "layer skip"])
def test_buffers_create_no_tensor_off_the_model_device(pair, name, kind):
    """The CPU guard tests/test_cuda.py uses: inside torch.device("meta") a tensor made without device= lands on
    the meta device and reading it raises, so a buffer, slot index, mask or readout made off the model's device
    fails here before it fails on a GPU."""
    options = options_for(name, pair, kv_cache=kind, temperature=1.0, seed=2)
    expected = generate(options, PROMPTS["long"], target=pair["target"], draft=pair["draft"]).output_ids
    with torch.device("meta"):
        trace = generate(options, PROMPTS["long"], target=pair["target"], draft=pair["draft"])
    assert trace.output_ids == expected


def test_greedy_output_with_buffers_equals_the_baseline(pair):
    """The lossless promise itself, not only agreement with the dynamic cache: a fixed-buffer tree equals the greedy
    baseline with a dynamic cache."""
    for prompt in PROMPTS.values():
        baseline = generate(DecodeOptions(max_new_tokens=LENGTH, kv_cache="dynamic"), prompt, target=pair["target"])
        for name in ("eagle2", "eagle2 head", "early exit"):
            trace = generate(options_for(name, pair, kv_cache="fixed"), prompt, target=pair["target"],
                             draft=pair["draft"])
            assert trace.output_ids == baseline.output_ids, name


# ---------------------------------------------------------------- sliding-window layers (Gemma 3)

GEMMA_METHODS = {"baseline": dict(), "prompt lookup": dict(method="speculative", drafter="prompt-lookup", gamma=4),
                 "layer skip": dict(method="speculative", drafter="layer-skip", rule="static", gamma=3),
                 "eagle2, llama draft": dict(method="speculative", drafter="eagle2", **TREE)}


@pytest.fixture(scope="module")
def gemma():
    from tiny import tiny_gemma3_mixed, tiny_llama

    return {"target": tiny_gemma3_mixed(sliding_window=8), "draft": tiny_llama(seed=9, layers=2)}


@pytest.mark.parametrize("kind", BUFFERS)
@pytest.mark.parametrize("name", list(GEMMA_METHODS))
def test_sliding_window_models_decode_the_same_tokens(gemma, name, kind):
    """A buffer keeps every entry of a sliding layer; its masks limit each query to the window instead (prompts and
    outputs run past the window of 8)."""
    for temperature in (0.0, 1.0):
        options = DecodeOptions(max_new_tokens=24, temperature=temperature, seed=2, **GEMMA_METHODS[name])
        for prompt in PROMPTS.values():
            dynamic = generate(replace(options, kv_cache="dynamic"), prompt, target=gemma["target"],
                               draft=gemma["draft"])
            buffered = generate(replace(options, kv_cache=kind), prompt, target=gemma["target"], draft=gemma["draft"])
            assert buffered.output_ids == dynamic.output_ids, (name, kind, temperature)


# ---------------------------------------------------------------- the runner: compaction, rollback, the last slot

ROUND_TREES = [[-1, 0, 0, 1, 2, 2, 3], [-1, 0, 1, 1, 0, 4], [-1, 0, 1, 2, 3]]  # branching, branching, a chain
KEEPS = [[0, 2, 5], [0, 4, 5], [0, 1, 2], [0], [0, 2, 4, 6]]  # tree paths: compaction (not a prefix) mostly


def tree_rounds(runner: CachedModel, rounds: int = 8) -> list[torch.Tensor]:
    """A prefill, then rounds of a tree forward and a verified path kept (compaction when it is not a prefix),
    with a rollback and a chain step between; returns every forward's logits."""
    out = [runner.forward(list(range(3, 15)))]
    for r in range(rounds):
        parents = ROUND_TREES[r % len(ROUND_TREES)]
        tokens = [(5 * r + 7 * i) % 60 + 1 for i in range(len(parents))]
        out.append(runner.forward_tree(DraftTree(tokens=tokens, parents=parents, q_token=[None] * len(parents))))
        keep = [node for node in KEEPS[r % len(KEEPS)] if node < len(parents)]
        keep = [node for i, node in enumerate(keep) if i == 0 or parents[node] == keep[i - 1]]  # a real path
        runner.keep_path(len(parents), keep)
        out.append(runner.forward([r + 1, r + 2]))
        runner.drop_last(1)  # a rejected draft rolled back
    return out


@pytest.mark.parametrize("kind", BUFFERS)
def test_tree_rounds_with_compaction_give_the_dynamic_caches_logits(tiny, kind):
    dynamic = CachedModel(tiny.model)
    buffered = CachedModel(tiny.model, KVPlan(kind, committed=80))
    for want, got in zip(tree_rounds(dynamic), tree_rounds(buffered)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert buffered.length == dynamic.length
    assert isinstance(buffered.cache.layers[0], BufferLayer)
    assert buffered.cache.layers[0].keys.shape[2] == buffered.capacity  # one allocation, never regrown


def test_an_off_by_one_slot_in_compaction_is_caught(tiny, monkeypatch):
    """The mutation: compaction gathers from one slot too far. The compaction test's comparison must fail."""
    from decoders.runtime import buffers

    real = buffers.compaction_slots

    def off_by_one(starts, keep):
        source, target = real(starts, keep)
        return [[slot + 1 for slot in layer] for layer in source], target

    dynamic = tree_rounds(CachedModel(tiny.model))
    monkeypatch.setattr(buffers, "compaction_slots", off_by_one)
    mutated = tree_rounds(CachedModel(tiny.model, KVPlan("static", committed=80)))
    assert any(not torch.allclose(a, b, atol=1e-3) for a, b in zip(dynamic, mutated))


class _Ops(torch.overrides.TorchFunctionMode):
    """Counts the tensor ops called inside it (functions and methods alike), by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _compaction_ops(layers: int) -> list[str]:
    """The tensor ops of one tree path's compaction in a static buffer of a `layers`-layer model."""
    from tiny import tiny_llama

    lm = tiny_llama(seed=2, layers=layers)
    runner = CachedModel(lm.model, KVPlan("static", committed=40))
    runner.forward(list(range(3, 12)))
    runner.forward_tree(DraftTree(tokens=[1, 2, 3, 4, 5], parents=[-1, 0, 0, 2, 2], q_token=[None] * 5))
    ops = _Ops()
    with ops:
        runner.keep_path(5, [0, 2, 4])
    assert all(layer.length == 9 + 3 for layer in runner.cache.layers)
    return ops.names


def test_compaction_is_one_gather_whatever_the_layer_count():
    """A tree path kept: one gather and one scatter over every layer's keys and values (issue 46), where it was an
    index_select and an index_copy_ per layer and tensor; the same ops for 2 layers as for 6."""
    two, six = _compaction_ops(2), _compaction_ops(6)
    moves = [name for name in six if name in ("gather", "scatter_", "index_select", "index_copy_", "copy_",
                                              "__setitem__", "index_put_", "take_along_dim")]
    assert moves == ["gather", "scatter_"] and two == six, (moves, two, six)


@pytest.mark.parametrize("kind", BUFFERS)
def test_a_buffer_fills_to_its_last_slot_and_refuses_one_more(tiny, kind):
    runner = CachedModel(tiny.model, KVPlan(kind, committed=20, buckets=(1, 2, 4)))
    dynamic = CachedModel(tiny.model)
    assert runner.capacity == (24 if kind == "fixed" else 20)  # fixed: room for the widest bucket's padding
    steps = [list(range(1, 17))] + [[t] for t in range(17, runner.capacity - 3)] + [[7, 8, 9, 10]]
    for tokens in steps:
        torch.testing.assert_close(runner.forward(tokens), dynamic.forward(tokens), rtol=1e-5, atol=1e-5)
    assert runner.length == runner.capacity  # the last slot holds the last token
    with pytest.raises(BufferFull, match="would pass the KV buffer"):
        runner.forward([5])
    runner.drop_last(2)  # a rollback frees slots: the next write fits again, with the right logits
    dynamic.drop_last(2)
    torch.testing.assert_close(runner.forward([5]), dynamic.forward([5]), rtol=1e-5, atol=1e-5)


def test_the_runs_budget_is_exactly_what_a_run_writes(pair, monkeypatch):
    """A chain run's target writes at most prompt + max_new_tokens - 1 slots (the last token is never fed), so a
    buffer of exactly that many finishes the run (its last verification ends on the last slot); one slot fewer fails
    with BufferFull, never a wrong token. ("static": a fixed buffer adds its widest bucket on top.)"""
    from decoders import api
    from decoders.runtime import buffers

    prompt = PROMPTS["short"]
    options = options_for("prompt lookup", pair, kv_cache="static")
    dynamic = dynamic_ids("prompt lookup", pair, "short", 0.0)
    real = api.kv_plan

    def tight(slack: int):
        def plan(options, model, prompt_tokens):  # the target writes at most prompt + max_new_tokens - 1 slots
            return replace(real(options, model, prompt_tokens), committed=prompt_tokens + options.max_new_tokens - 1
                           - slack)
        return plan

    monkeypatch.setattr(api, "kv_plan", tight(0))
    assert generate(options, prompt, target=pair["target"]).output_ids == dynamic
    monkeypatch.setattr(api, "kv_plan", tight(1))
    with pytest.raises(buffers.BufferFull):
        generate(options, prompt, target=pair["target"])


# ---------------------------------------------------------------- choosing the cache

def test_options_name_the_cache_kinds_and_refuse_graphs_without_fixed_shapes():
    from tiny import tiny_llama

    with pytest.raises(OptionsError, match="unknown kv_cache 'paged'"):
        DecodeOptions(kv_cache="paged").validate()
    with pytest.raises(OptionsError, match="kv_cache='fixed'"):
        DecodeOptions(kv_cache="dynamic", cuda_graphs=True).validate()
    on_cpu = tiny_llama(layers=2)
    on_cpu = replace(on_cpu, model=on_cpu.model.cpu(), device=torch.device("cpu"))  # whatever SPECLAB_TEST_DEVICE is
    with pytest.raises(OptionsError, match="this run is on cpu"):
        generate(DecodeOptions(cuda_graphs=True, max_new_tokens=4), [1, 2, 3], target=on_cpu)


def test_auto_keeps_the_dynamic_cache_unless_graphs_ask_for_fixed_shapes(tiny):
    from decoders.runtime.buffers import resolve

    trace = generate(DecodeOptions(max_new_tokens=4), [1, 2, 3], target=tiny)
    assert trace.runtime["target"] == {"kv_cache": "dynamic", "capacity": None}
    assert trace.runtime["device"].startswith(tiny.device.type) and "PyTorch" in trace.runtime["machine"]
    assert resolve("auto", torch.device("cpu")) == resolve("auto", torch.device("cuda")) == "dynamic"
    assert resolve("auto", torch.device("cuda"), graphs=True) == "fixed"


def test_the_runtime_field_survives_json_and_older_traces_load(tiny):
    from decoders.trace import Trace

    trace = generate(DecodeOptions(max_new_tokens=4, kv_cache="fixed"), [1, 2, 3], target=tiny)
    again = Trace.from_json(trace.to_json())
    assert again.runtime == trace.runtime and again.runtime["target"]["widths"] == [1, 2]
    older = trace.to_dict()
    del older["runtime"]
    assert Trace.from_dict(older).runtime is None
