"""Fixed-shape forwards and CUDA graphs (issue 32, part 2).

On the CPU: the bucket a width is padded to, the masks and inputs one packed tensor unpacks to (the same code a graph
replays), a padded forward giving the unpadded one's logits, and the round's one host read (decoders/readout.py).
On a GPU (skipped with the reason on a CPU): a replayed graph gives the eager forward's logits, every method with
cuda_graphs=True decodes the baseline's tokens (greedy) and its own eager run's (sampled, same seed), and the trace
says which forwards replayed a graph.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kv_helpers import METHODS, PROMPTS, drafter_pair, options_for

from decoders import DecodeOptions, generate
from decoders.runtime.buffers import BUCKETS, KVPlan
from decoders.runtime.graphs import bucket, fixed_inputs, pack_inputs
from decoders.readout import read_round
from decoders.runtime.runner import CachedModel
from decoders.sampling import raw_probs
from decoders.trace import TOP_LOGITS
from decoders.tree import DraftTree, attention_mask_4d, depths

BRANCHING = [-1, 0, 0, 1, 1, 2, 3, 6]


def test_a_width_is_padded_to_the_smallest_bucket_that_holds_it():
    assert [bucket(n, BUCKETS) for n in (1, 2, 3, 5, 9, 17, 33, 60, 64)] == [1, 2, 4, 8, 16, 32, 64, 64, 64]
    assert bucket(65, BUCKETS) == 65 and bucket(100, BUCKETS) == 100  # past the widest: its own width, eagerly
    assert bucket(7, ()) == 7  # no buckets: exact widths


@pytest.mark.parametrize("parents", [BRANCHING, list(range(-1, 5))], ids=["tree", "chain"])
def test_the_fixed_mask_is_the_tree_mask_over_the_valid_slots_and_hides_the_rest(parents):
    start, width, capacity = 11, bucket(len(parents), BUCKETS), 40
    tokens = [3 + i for i in range(len(parents))]
    ids, positions, slots, mask = fixed_inputs(pack_inputs(tokens, parents, start, width), width, capacity,
                                               torch.float32)
    n = len(parents)
    assert ids[0, :n].tolist() == tokens and ids[0, n:].eq(0).all()
    assert slots.tolist() == list(range(start, start + width))
    visible = mask[0, 0] == 0  # (w, S)
    expected = attention_mask_4d(parents, start, torch.float32)[0, 0] == 0  # (n, start + n): the dynamic cache's
    assert torch.equal(visible[:n, :start + n], expected)
    assert not visible[:n, start + n:].any()  # padding and never-written slots: hidden from every real row
    for row in range(n, width):  # a padding row sees the committed slots and itself, so its softmax is defined
        assert visible[row, start + row] and visible[row, :start].all() and visible[row, start:].sum() == 1
    assert positions[0, :n].tolist() == [start + d for d in depths(parents)]  # siblings share a position


def test_the_sliding_mask_limits_each_query_to_its_window():
    start, width, window = 20, 8, 6
    parents = BRANCHING
    _, positions, _, masks = fixed_inputs(pack_inputs(list(range(1, 9)), parents, start, width), width, 40,
                                          torch.float32, window=window)
    full, sliding = masks["full_attention"][0, 0] == 0, masks["sliding_attention"][0, 0] == 0
    for row in range(len(parents)):
        query = int(positions[0, row])
        for slot in range(start):  # committed slot j holds position j
            assert sliding[row, slot] == (full[row, slot] and query - slot < window)
    assert torch.equal(sliding[:, start:], full[:, start:])  # the block's own nodes are all within the window here


@pytest.mark.parametrize("parents", [BRANCHING, list(range(-1, 6)), [-1]], ids=["tree", "chain", "one token"])
def test_a_padded_forward_gives_the_unpadded_logits(tiny, parents):
    padded = CachedModel(tiny.model, KVPlan("fixed", committed=60))
    exact = CachedModel(tiny.model, KVPlan("fixed", committed=60, buckets=()))
    dynamic = CachedModel(tiny.model)
    context = [(3 * i) % 50 + 1 for i in range(13)]
    tree = DraftTree(tokens=[5 + i for i in range(len(parents))], parents=parents, q_token=[None] * len(parents))
    for runner in (padded, exact, dynamic):
        runner.forward(context)
    want = dynamic.forward_tree(tree)
    for runner in (padded, exact):
        torch.testing.assert_close(runner.forward_tree(tree), want, rtol=1e-5, atol=1e-5)
        assert runner.length == dynamic.length  # padding slots were written but are not counted valid
    assert padded.fixed.summary()["widths"] == sorted({16, bucket(len(parents), BUCKETS)})  # the prefill: 16


# ---------------------------------------------------------------- the round's one host read

def test_the_readout_reads_what_verify_and_the_recorder_read(tiny):
    tree = DraftTree(tokens=[4, 9, 2, 7, 1], parents=[-1, 0, 0, 1, 3], q_token=[None] * 5)
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))  # (N+1, V)
    for p in (None, torch.softmax(logits / 0.7, -1)):
        readout = read_round(tree, logits, p, record=True)
        assert readout.argmax == logits.argmax(-1).tolist()
        values, ids = logits.topk(TOP_LOGITS, dim=-1)
        want = [[[i, v] for i, v in zip(row_i, row_v)] for row_i, row_v in zip(ids.tolist(), values.tolist())]
        assert readout.top == want  # (N+1) rows of the TOP_LOGITS best [id, logit]
        shown = raw_probs(logits) if p is None else p
        assert readout.shown == pytest.approx([float(shown[tree.parents[i], tree.tokens[i]]) for i in range(1, 5)])
    assert read_round(tree, logits, None, record=False).shown is None


def test_the_readout_copies_to_the_host_once(monkeypatch):
    copies = []
    real = torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        copies.append(self.shape)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    tree = DraftTree(tokens=[4, 9, 2], parents=[-1, 0, 1], q_token=[None] * 3)
    read_round(tree, torch.randn(3, 64), None, record=True)
    assert len(copies) == 1


# ---------------------------------------------------------------- on a GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA graphs need one")


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory):
    """Tiny models on the GPU as load_model leaves a model there: norms fused (decoders/runtime/kernels.py; tests/test_cuda.py
    covers the stock modules)."""
    from decoders.runtime import kernels

    def to_cuda(lm):
        model = lm.model.to("cuda")
        kernels.pack(model)
        return replace(lm, model=model, device=torch.device("cuda"))

    return drafter_pair(tmp_path_factory.mktemp("gpu-drafters"), move=to_cuda)


@needs_cuda
@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 30, 59])
def test_a_replayed_graph_gives_the_eager_forwards_logits(gpu_pair, n):
    model = gpu_pair["target"].model
    graphs = CachedModel(model, KVPlan("fixed", committed=200, graphs=True))
    eager = CachedModel(model, KVPlan("fixed", committed=200))
    parents = [-1] + [max(0, (i - 1) // 2) for i in range(1, n)]  # a branching tree of n nodes
    context = [(7 * i) % 60 + 1 for i in range(20)]
    for runner in (graphs, eager):
        runner.forward(context)
    for round_ in range(4):  # round 0 runs eagerly (first use of the width), round 1 captures, 2-3 replay
        tree = DraftTree(tokens=[(round_ + 3 * i) % 60 + 1 for i in range(n)], parents=parents, q_token=[None] * n)
        got = graphs.forward_tree(tree)
        # the eager runner pads like the graphs (to the cheapest timed bucket): another width sums in another order
        # (the H200 moved a logit by 1.4e-5 between widths 16 and 32)
        eager.fixed.choose_by_time, eager.fixed.seconds = True, graphs.fixed.seconds
        want = eager.forward_tree(tree)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        keep = [0] + ([2] if n > 2 else [])  # a compaction between replays
        for runner in (graphs, eager):
            runner.keep_path(n, keep)
    assert graphs.fixed.summary()["graph"] >= 2 and bucket(n, BUCKETS) in graphs.fixed.summary()["captured"]


@needs_cuda
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_with_cuda_graphs_equals_the_baseline(gpu_pair, name):
    for prompt in PROMPTS.values():
        baseline = generate(DecodeOptions(max_new_tokens=30, kv_cache="dynamic"), prompt, target=gpu_pair["target"])
        trace = generate(options_for(name, gpu_pair, cuda_graphs=True), prompt, target=gpu_pair["target"],
                         draft=gpu_pair["draft"])
        assert trace.output_ids == baseline.output_ids, name
        assert trace.runtime["target"]["kv_cache"] == "fixed"
        if name != "layer skip":  # it drafts with layers swapped out, outside the captured forwards
            assert trace.runtime["target"]["graph"] > 0, trace.runtime


@needs_cuda
@pytest.mark.parametrize("name", list(METHODS))
def test_sampled_runs_with_cuda_graphs_draw_what_eager_runs_draw(gpu_pair, name):
    for seed in range(2):
        options = options_for(name, gpu_pair, temperature=1.0, seed=seed, kv_cache="fixed")
        eager = generate(options, PROMPTS["short"], target=gpu_pair["target"], draft=gpu_pair["draft"])
        graphs = generate(replace(options, cuda_graphs=True), PROMPTS["short"], target=gpu_pair["target"],
                          draft=gpu_pair["draft"])
        assert graphs.output_ids == eager.output_ids, (name, seed)


@needs_cuda
def test_the_draft_models_step_replays_a_graph(gpu_pair):
    trace = generate(options_for("draft model, static", gpu_pair, cuda_graphs=True), PROMPTS["long"],
                     target=gpu_pair["target"], draft=gpu_pair["draft"])
    assert trace.runtime["draft"]["graph"] > 0 and 1 in trace.runtime["draft"]["captured"]


# ---------------------------------------------------------------- the graph path's bookkeeping, emulated on the CPU

@pytest.fixture
def emulated_graphs(monkeypatch):
    """CUDA graphs stood in for on the CPU: a "capture" keeps the forward, a "replay" runs it again into the captured
    outputs (a real replay re-runs the captured kernels on the same input and output tensors, and runs no Python).
    What this checks is SpecLab's side: leases, lengths put back after capture and advanced after replay, inputs
    copied into the captured tensor, outputs cloned before the next replay, counts."""
    from decoders.runtime import buffers, graphs

    class Replay:
        def __init__(self, forward, outputs):
            self.forward, self.outputs = forward, outputs

        def replay(self):
            logits, states = self.forward()
            self.outputs[0].copy_(logits)
            if states is not None:
                self.outputs[1].copy_(states)

    def capture(forward, pool=None):
        outputs = forward()
        return Replay(forward, outputs), outputs, pool

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(buffers, "check_graphs", lambda graphs, device: None)
    # CPU timings would pick a random bucket per run; the timing itself is checked on its own below
    monkeypatch.setattr(graphs.FixedForward, "_time_buckets", lambda self, repeats=3: {})


@pytest.fixture(scope="module")
def cpu_pair(tmp_path_factory):
    return drafter_pair(tmp_path_factory.mktemp("cpu-drafters"))


@pytest.mark.parametrize("name", list(METHODS))
def test_the_graph_path_decodes_what_the_eager_path_decodes(cpu_pair, emulated_graphs, name):
    for temperature in (0.0, 1.0):
        options = options_for(name, cpu_pair, kv_cache="fixed", temperature=temperature, seed=4)
        eager = generate(options, PROMPTS["long"], target=cpu_pair["target"], draft=cpu_pair["draft"])
        for run in range(2):  # the second run replays the graphs the first one captured (kept per model)
            trace = generate(replace(options, cuda_graphs=True), PROMPTS["long"], target=cpu_pair["target"],
                             draft=cpu_pair["draft"])
            assert trace.output_ids == eager.output_ids, (name, temperature, run)
            target = trace.runtime["target"]
            assert target["capacity"] == 256  # rounded up so runs share the kept buffers
            if name != "layer skip":  # early exit's verification replays too (decoders/selfdraft/upper.py)
                assert target["graph"] + target["eager"] == len(trace.rounds) + 1 and target["graph"] > 0
            if "draft" in trace.runtime and name.startswith("draft model"):
                assert trace.runtime["draft"]["graph"] > 0


def test_kept_graphs_are_leased_to_one_runner_at_a_time(tiny, emulated_graphs):
    """A draft model that is the target itself gets buffers of its own, not the target's."""
    from decoders.runtime import graphs

    plan = KVPlan("fixed", committed=40, graphs=True)
    first, second = CachedModel(tiny.model, plan), CachedModel(tiny.model, plan)
    assert first.cache is not second.cache
    first.release()
    third = CachedModel(tiny.model, plan)
    assert third.cache is graphs._KEPT[tiny.model][0].cache and third.fixed.leased
    assert not first.fixed.graphs  # a released runner goes on eagerly, on buffers of its own


def test_a_model_with_kept_graphs_is_freed_once_nobody_holds_it(emulated_graphs):
    """The kept table maps a model to its FixedForwards; a value holding its key would keep the model (and its
    buffers and graphs) alive for good after the run gave it back and the residency evicted it."""
    import gc
    import weakref

    from tiny import tiny_llama

    model = tiny_llama(layers=1, seed=3).model
    runner = CachedModel(model, KVPlan("fixed", committed=40, graphs=True))
    for _ in range(3):  # the prefill, then a replayed width: a graph captured and kept
        runner.forward([1, 2, 3])
    assert runner.fixed.captured and runner.fixed.leased
    runner.release()
    gone = weakref.ref(model)
    del model, runner
    gc.collect()
    assert gone() is None


# ---------------------------------------------------------------- padding to the cheapest measured bucket

H200_REPLAYS = {1: 4.5, 2: 5.4, 4: 5.4, 8: 8.5, 16: 9.0, 32: 6.2, 64: 7.0}  # ms, shaped like the H200's (bench/results)


def test_with_measured_replays_a_width_pads_to_the_cheapest_bucket_that_holds_it():
    assert [bucket(n, BUCKETS, H200_REPLAYS) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 32, 32, 32, 64, 64]
    assert bucket(3, BUCKETS, {1: 1.0, 2: 2.0, 4: 2.0}) == 4  # only buckets that hold n; a tie goes to the narrower
    assert bucket(3, BUCKETS, {4: 2.0, 8: 2.0}) == 4 and bucket(3, BUCKETS, {8: 1.0}) == 8  # unmeasured: never
    assert bucket(65, BUCKETS, H200_REPLAYS) == 65  # past the widest: its own width, eagerly


def test_a_forward_padded_to_a_wider_cheaper_bucket_gives_the_same_logits(tiny):
    padded = CachedModel(tiny.model, KVPlan("fixed", committed=60))
    padded.fixed.choose_by_time, padded.fixed.seconds = True, {w: 1.0 for w in BUCKETS} | {16: 2.0, 32: 1.5, 64: 3.0}
    dynamic = CachedModel(tiny.model)
    context = [(3 * i) % 50 + 1 for i in range(13)]
    tree = DraftTree(tokens=[5 + i for i in range(9)], parents=BRANCHING + [7], q_token=[None] * 9)
    for runner in (padded, dynamic):
        runner.forward(context)
    torch.testing.assert_close(padded.forward_tree(tree), dynamic.forward_tree(tree), rtol=1e-5, atol=1e-5)
    assert padded.length == dynamic.length and 32 in padded.fixed.summary()["widths"]  # 9 nodes ran at 32, not 16


def test_greedy_ids_and_widths_do_not_follow_a_processs_own_bucket_timing(emulated_graphs, monkeypatch, tmp_path):
    """Two processes that time the buckets in opposite orders still pad every forward alike: the first one's table
    is stored per device, model, dtype and kernels and the second reads it (a model object of its own stands for the
    second process). Each round here verifies 9 tokens: bucket 16 or 32, whichever the table says is cheaper."""
    import copy

    from decoders.runtime import graphs
    from tiny import tiny_llama

    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    flat = {w: 1.0 for w in BUCKETS} | {64: 3.0}
    orders = [flat | {16: 2.0, 32: 1.5}, flat | {16: 1.5, 32: 2.0}]
    options = DecodeOptions(method="speculative", rule="static", gamma=8, max_new_tokens=24, kv_cache="fixed",
                            cuda_graphs=True)
    source = tiny_llama(layers=2, seed=5)
    runs = []
    for timing in orders:
        monkeypatch.setattr(graphs.FixedForward, "_time_buckets", lambda self, repeats=3, t=timing: dict(t))
        lm = replace(source, model=copy.deepcopy(source.model))  # no kept graphs, no timing in memory
        trace = generate(options, [3, 1, 4, 1, 5, 9, 2, 6], target=lm, draft=lm)
        runs.append((trace.output_ids, trace.runtime["target"]["widths"], trace.runtime["target"]["bucket_ms"]))
    assert runs[0] == runs[1] and 32 in runs[0][1] and 16 not in runs[0][1]


def test_a_timing_that_misses_a_bucket_is_not_stored_and_pads_by_the_smallest(tiny, monkeypatch, tmp_path):
    from decoders.runtime import graphs

    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    forward = CachedModel(tiny.model, KVPlan("fixed", committed=40)).fixed
    monkeypatch.setattr(graphs.FixedForward, "_time_buckets", lambda self, repeats=3: {1: 1.0, 32: 0.5})
    assert forward._bucket_table() == {} and not (tmp_path / graphs.BUCKET_TABLES).exists()
    (tmp_path / graphs.BUCKET_TABLES).write_text("{not json")  # a damaged file: timed again, then stored whole
    monkeypatch.setattr(graphs.FixedForward, "_time_buckets", lambda self, repeats=3: {w: 1.0 for w in BUCKETS})
    assert forward._bucket_table() == {w: 1.0 for w in BUCKETS}
    assert graphs.read_bucket_table(graphs.table_key(tiny.model, BUCKETS)) == {w: 1.0 for w in BUCKETS}


def test_kept_graphs_are_matched_to_the_models_kernels():
    import copy

    from decoders.runtime import fused, kernels
    from decoders.runtime.graphs import give_back, lease
    from tiny import tiny_llama

    model = copy.deepcopy(tiny_llama(layers=2).model)
    fused.fuse(model)  # the first fuse moves q/k/v and gate/up into joined weights; later switches keep them
    kernels.use(model, kernels.STOCK)
    first = lease(model, 256, BUCKETS, None)
    give_back(first)
    assert lease(model, 256, BUCKETS, None) is first  # kept for the next run
    give_back(first)
    fused.fuse(model)  # a captured graph would replay the stock modules' kernels
    fused_forward = lease(model, 256, BUCKETS, None)
    assert fused_forward is not first and fused_forward.kernels == kernels.PACKED
    give_back(fused_forward)
    kernels.use(model, kernels.STOCK)
    assert lease(model, 256, BUCKETS, None) is first  # the stock graphs are kept for the stock modules


def test_kept_graphs_whose_weights_moved_are_dropped_not_replayed():
    """A graph reads the addresses it was captured with: after a dtype (or device) move, or the first fuse, the old
    weights are freed, and a kept forward captured before must not be leased again."""
    import copy

    from decoders.runtime import fused, graphs
    from decoders.runtime.graphs import give_back, lease
    from tiny import tiny_llama

    model = copy.deepcopy(tiny_llama(layers=2).model)
    before = lease(model, 256, BUCKETS, None)
    give_back(before)
    fused.fuse(model)
    fused.unfuse(model)  # stock kernels again, but q/k/v now view the joined weights: the old ones are gone
    again = lease(model, 256, BUCKETS, None)
    assert again is not before and graphs._KEPT[model] == [again]
    give_back(again)
    model.to(torch.float64)
    moved = lease(model, 256, BUCKETS, None)
    assert moved is not again and graphs._KEPT[model] == [moved]
    give_back(moved)


def test_a_replay_waits_for_the_last_copy_out_of_the_staging_buffer_before_overwriting_it(tiny, emulated_graphs):
    """On a GPU the packed inputs go from a pinned host buffer asynchronously: the next replay of that width may
    write the buffer only once the copy finished (its event; here a stand-in that notes what the buffer held)."""
    runner = CachedModel(tiny.model, KVPlan("fixed", committed=40, graphs=True))
    seen = []

    class Event:
        def synchronize(self):
            seen.append(("wait", captured.host.clone()))

        def record(self):
            seen.append(("record", captured.host.clone()))

    try:
        runner.forward([1, 2, 3, 4, 5])  # the prefill; then a width replayed twice
        runner.forward([6])
        runner.forward([7])
        captured = runner.fixed.captured[(1, False)]
        captured.sent = Event()
        runner.forward([8])
        (wait, before), (record, after) = seen
        assert (wait, record) == ("wait", "record") and before[0] == 7 and after[0] == 8
    finally:
        runner.release()


def test_the_first_replayable_forward_captures_and_times_every_bucket(tiny, monkeypatch):
    from decoders.runtime import buffers, graphs

    monkeypatch.setattr(graphs, "capture", lambda forward, pool=None: (_Rerun(forward), forward(), pool))
    monkeypatch.setattr(buffers, "check_graphs", lambda graphs, device: None)
    runner = CachedModel(tiny.model, KVPlan("fixed", committed=40, graphs=True))
    try:
        runner.forward([(5 * i) % 50 + 1 for i in range(11)])  # the prefill initializes the buffers
        lengths = runner.cache.lengths()
        timed = runner.fixed._time_buckets()
        assert sorted(timed) == sorted(BUCKETS) and all(t > 0 for t in timed.values())
        assert {w for w, _ in runner.fixed.captured} == set(BUCKETS)
        assert runner.cache.lengths() == lengths  # timing replays write past the valid prefix, counted nowhere
        runner.fixed.seconds = timed
        assert "bucket_ms" in runner.runtime()  # the trace says what the padding was chosen from
    finally:
        runner.release()


class _Rerun:
    """A stand-in graph: replay runs the captured forward again."""

    def __init__(self, forward):
        self.forward = forward

    def replay(self):
        self.forward()
