"""The per-machine cost model (decoders/costs.py): measured once, cached, never running backwards."""
from __future__ import annotations

import copy

import pytest
import torch

from decoders import costs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture
def tiny():
    """Its own model (stock kernels): the session's may have been packed by a bench test, and is deep-copied here."""
    from tiny import tiny_llama

    return tiny_llama(layers=4)


def test_monotone_pools_adjacent_violators():
    assert costs.monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert costs.monotone([5.0, 1.0, 1.0]) == [7 / 3] * 3
    values = [1.0, 1.1, 1.05, 1.3, 1.2, 1.25, 2.0]
    fitted = costs.monotone(values)
    assert all(a <= b for a, b in zip(fitted, fitted[1:]))
    assert sum(fitted) == pytest.approx(sum(values))  # least squares keeps the mean of each pooled block


def test_smooth_starts_at_one_and_never_runs_backwards():
    """The committed Qwen curve once had t(2) = 1.11 > t(3) = 1.01: the smoothed curve cannot."""
    seconds = {1: 0.80, 2: 0.89, 3: 0.81, 4: 0.95, 8: 1.30, 16: 1.20, 32: 2.5}
    curve = costs.smooth(seconds)
    values = [curve[n] for n in sorted(curve)]
    assert values[0] == 1.0 and all(a <= b for a, b in zip(values, values[1:]))
    assert curve[3] == curve[2] and curve[16] == curve[8]


def test_interpolate_between_and_beyond():
    curve = {1: 1.0, 4: 1.3, 8: 2.1}
    assert costs.interpolate(curve, 1) == 1.0
    assert costs.interpolate(curve, 2) == pytest.approx(1.1)
    assert costs.interpolate(curve, 12) == pytest.approx(2.9)  # the last segment's slope, 0.2 per token


def test_branching_tree_branches():
    tree = costs.branching_tree(5, 6, vocab=64)
    assert tree.size == 7 and not tree.is_chain() and tree.parents[:4] == [-1, 0, 0, 1]


def test_measure_is_cached_per_dtype_and_refreshed_on_demand(tiny, cache):
    first = costs.measure(tiny, ns=(1, 2, 4), repeats=2)
    assert first.chain[1] == 1.0 and set(first.chain) == set(first.tree) == {1, 2, 4}
    assert first.step_seconds > 0 and first.draft_step_seconds > 0 and first.repeats == 2
    again = costs.measure(tiny, ns=(1, 2, 4), repeats=2)
    assert again == first  # read back, not re-timed (the timings would differ)
    fresh = costs.measure(tiny, ns=(1, 2, 4), repeats=2, refresh=True)
    assert fresh.measured_at >= first.measured_at and fresh.raw_chain != first.raw_chain or fresh.spread != first.spread
    half = copy.deepcopy(tiny)
    half.model = half.model.to(torch.bfloat16)
    other = costs.measure(half, ns=(1, 2), repeats=1)
    assert other.dtype == "bfloat16" and costs.cached(tiny.name, "float32", "stock") is not None


def test_format_speedup_needs_both_measurements(tiny, cache):
    assert costs.format_speedup(tiny.name, "bfloat16") is None  # nothing measured: no claim
    costs.measure(tiny, ns=(1, 2), repeats=1)
    assert costs.format_speedup(tiny.name, "bfloat16") is None  # float32 alone: still no claim
    half = copy.deepcopy(tiny)
    half.model = half.model.to(torch.bfloat16)
    costs.measure(half, ns=(1, 2), repeats=1)
    ratio = costs.format_speedup(tiny.name, "bfloat16")
    expected = costs.cached(tiny.name, "float32", "stock").step_seconds / costs.cached(tiny.name, "bfloat16").step_seconds
    assert ratio == pytest.approx(expected)


def test_a_run_measures_again_when_its_curve_was_taken_on_a_busy_machine(tiny, cache, monkeypatch):
    """Issue 33 item 4: the curve records the load it was measured under; a run re-measures a busy one once the
    machine is quiet, and says in its trace which curve it used."""
    monkeypatch.setattr(costs, "load_per_core", lambda: 3.0)  # e.g. a test suite beside it on 2 cores
    first, used = costs.for_run(tiny, prompt_tokens=20, ns=(1, 2, 4))
    assert used["remeasured"] and used["why"] == "none stored" and first.busy()
    assert used["load_per_core"] == 3.0 and used["context_tokens"] == costs.DEFAULT_CONTEXT
    assert used["age_seconds"] is not None and used["machine"] == first.machine and used["measured_at"]
    again, used = costs.for_run(tiny, prompt_tokens=20, ns=(1, 2, 4))  # still busy: nothing quieter to be had
    assert not used["remeasured"] and again == first
    monkeypatch.setattr(costs, "load_per_core", lambda: 0.1)
    fresh, used = costs.for_run(tiny, prompt_tokens=20, ns=(1, 2, 4))
    assert used["remeasured"] and "busy" in used["why"] and not fresh.busy()
    kept, used = costs.for_run(tiny, prompt_tokens=20, ns=(1, 2, 4))
    assert not used["remeasured"] and kept == fresh  # the quiet curve is preferred from now on


def test_a_curve_serves_contexts_within_a_factor_of_four():
    assert costs.run_context(20, 32) == costs.run_context(384, 32) == costs.DEFAULT_CONTEXT
    assert costs.run_context(1000, 32) == 1024 and costs.run_context(1000, 32, model_context=600) == 568
    assert costs._near(96, 384) and not costs._near(96, 1024) and costs._near(1024, 1000)
    old = {"x|m|float32|stock|6x5": costs.CostCurve("m", "float32", "stock", "cpu", (1, 2), 0.1, 0.1,
                                                      {1: 1.0, 2: 1.1}, {1: 1.0, 2: 1.2}).to_dict()}
    assert costs._best(old, "x|m|float32|stock|dynamic", context_tokens=1024) is None  # measured at 96: too far
    unknown = costs._best(old, "x|m|float32|stock|dynamic", context_tokens=100)
    assert unknown is not None and unknown.load_per_core is None and unknown.busy()  # an old curve: load unknown


def test_a_graph_run_and_an_eager_run_are_priced_by_the_curves_of_their_own_paths(tiny, cache, monkeypatch):
    """The controller of a run replaying CUDA graphs weighs a curve timed on the graph path (padded to the buckets
    the run pads to), not the eager DynamicCache's: on an H200 they differ by far (decoders/costs.py). CUDA graphs
    are stood in for on the CPU as in tests/test_graphs.py (a replay runs the captured forward again)."""
    from dataclasses import replace

    from decoders import DecodeOptions, generate
    from decoders.runtime import buffers, graphs

    class Rerun:
        def __init__(self, forward, outputs):
            self.forward, self.outputs = forward, outputs

        def replay(self):
            logits, states = self.forward()
            self.outputs[0].copy_(logits)

    monkeypatch.setattr(graphs, "capture", lambda forward, pool=None: (Rerun(forward, forward()), forward(), pool))
    monkeypatch.setattr(buffers, "check_graphs", lambda graphs, device: None)
    eager = DecodeOptions(method="speculative", drafter="prompt-lookup", controller="cost", max_new_tokens=6)
    used = {}
    for options in (eager, replace(eager, kv_cache="fixed", cuda_graphs=True)):
        trace = generate(options, [4, 5, 6, 4, 5, 6, 4, 5], target=tiny)
        used[trace.runtime["target"]["kv_cache"], options.cuda_graphs] = trace.totals["cost_curve"]
    assert {key: use["path"] for key, use in used.items()} == {("dynamic", False): "dynamic", ("fixed", True): "graphs"}
    assert all(use["remeasured"] and use["why"] == "none stored" for use in used.values())  # not the other's curve
    graph_curve = costs.cached(tiny.name, "float32", "stock", path="graphs")
    assert graph_curve.path == "graphs" and 64 in graph_curve.ns  # every bucket a padded forward can run at
    assert costs.cached(tiny.name, "float32", "stock").path == "dynamic"


def test_curves_stored_before_paths_were_keyed_read_as_the_eager_path():
    old = costs.CostCurve("m", "float32", "stock", "cpu", (1, 2), 0.1, 0.1, {1: 1.0, 2: 1.1}, {1: 1.0, 2: 1.2})
    stored = {"x|m|float32|stock|2x5|96": {k: v for k, v in old.to_dict().items() if k != "path"}}
    assert costs._best(stored, "x|m|float32|stock|dynamic").path == "dynamic"
    assert costs._best(stored, "x|m|float32|stock|graphs") is None


def test_on_a_padded_path_t_of_n_is_its_buckets_cost():
    """A forward of 33 tokens on the graph path runs at bucket 64: priced at t(64), not between t(32) and t(48)."""
    h200 = {1: 1.0, 2: 1.21, 4: 1.21, 8: 1.38, 16: 1.38, 32: 1.38, 64: 1.57}  # shaped like bench/results/gpu-h200.md
    graphs = costs.CostCurve("m", "float32", "packed", "gpu", tuple(h200), 0.004, 0.004, h200, h200, path="graphs")
    assert [graphs.t(n) for n in (1, 3, 5, 17, 32, 33, 64)] == [1.0, 1.21, 1.38, 1.38, 1.38, 1.57, 1.57]
    dynamic = costs.CostCurve("m", "float32", "packed", "gpu", tuple(h200), 0.004, 0.004, h200, h200)
    assert dynamic.t(33) == pytest.approx(1.38 + 0.19 / 32) and graphs.t(65) == dynamic.t(65)  # beyond: the slope


def test_a_curve_stored_by_another_version_with_more_fields_still_reads():
    """The cost cache is shared by every checkout on the machine; a newer one's extra field must not break a run."""
    curve = costs.CostCurve("m", "float32", "stock", "cpu", (1, 2), 0.1, 0.1, {1: 1.0, 2: 1.1}, {1: 1.0, 2: 1.2})
    assert costs.CostCurve.from_dict({**curve.to_dict(), "a_later_field": "dynamic"}) == curve
