"""How a run executed, on screen (issue 32, part 5): the device and which forwards replayed CUDA graphs, read from
the trace's own record (Trace.runtime), and the Race's t(n) panel read for the device the race ran on."""
from __future__ import annotations

from decoders import DecodeOptions, generate

from app.figures.runtime import runtime_line
from app.figures.stats import stats_html

GPU_RUN = {"machine": "NVIDIA H100 80GB HBM3, PyTorch 2.11.0+cu130", "device": "cuda:0",
           "target": {"kv_cache": "fixed", "capacity": 256, "graph": 61, "eager": 2, "widths": [1, 16, 32]},
           "draft": {"kv_cache": "fixed", "capacity": 256, "graph": 120, "eager": 1, "widths": [1, 16]}}


def test_a_cpu_run_says_every_forward_ran_eagerly(tiny):
    trace = generate(DecodeOptions(max_new_tokens=4), [1, 2, 3], target=tiny)
    line = runtime_line(trace)
    assert line.startswith("Ran on ") and "(cpu)" in line and "DynamicCache" in line and "every forward eager" in line
    page = stats_html(trace)
    assert 'class="sl-runtime" title="How this run executed' in page  # the meaning on hover


def test_a_gpu_run_says_which_forwards_replayed_graphs(tiny):
    trace = generate(DecodeOptions(max_new_tokens=4), [1, 2, 3], target=tiny)
    trace.runtime = GPU_RUN
    line = runtime_line(trace)
    assert "NVIDIA H100 80GB HBM3" in line and "(cuda:0)" in line
    assert "target: static buffers at fixed shapes, 256 slots, 61 of 63 forwards replayed as CUDA graphs, 2 eager " \
           "(widths 1, 16, 32)" in line
    assert "draft: static buffers at fixed shapes, 256 slots, 120 of 121 forwards" in line


def test_a_gpu_run_says_which_timed_width_its_forwards_padded_to(tiny):
    trace = generate(DecodeOptions(max_new_tokens=4), [1, 2, 3], target=tiny)
    trace.runtime = {**GPU_RUN, "target": {**GPU_RUN["target"], "bucket_ms": {"1": 3.815, "16": 8.172, "32": 5.291}}}
    assert "(widths 1, 16, 32), each padded to the cheapest timed width (ms per replay: 1: 3.8, 16: 8.2, 32: 5.3)" \
        in runtime_line(trace)  # keys as a saved trace's JSON has them


def test_a_fixed_shape_run_without_graphs_says_eager(tiny):
    trace = generate(DecodeOptions(max_new_tokens=4, kv_cache="fixed"), [1, 2, 3], target=tiny)
    assert "all 5 forwards eager (widths 1, 2)" in runtime_line(trace)  # the prefill and four steps


def test_an_older_trace_says_it_was_not_recorded(tiny):
    trace = generate(DecodeOptions(max_new_tokens=4), [1, 2, 3], target=tiny)
    trace.runtime = None
    assert "not recorded" in runtime_line(trace)


def test_the_race_reads_the_cost_curve_of_its_device(monkeypatch):
    from app.tabs.race import curves, runs

    asked = []
    monkeypatch.setattr(curves, "this_machine", lambda model, dtype, device="auto": asked.append(device))
    runs.cost_views("smollm2-135m", "auto", "cuda:0")
    assert asked == ["cuda:0"]

    class Trace:
        models = {"target": {"device": "cuda:0"}}

    assert runs._device(Trace()) == "cuda:0"
