"""Early exit's verification as one fixed-shape forward (issue 46, decoders/selfdraft/upper.py).

Layers k..L-1 over the drafted h_k, padded to a bucket over the target's buffer, give the full model's logits; the
graph path captures each width once and replays it (emulated on the CPU as tests/test_graphs.py does: the capture
keeps the forward, a replay runs it into the captured outputs; a real capture runs under needs_cuda on a GPU).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kv_helpers import PROMPTS, options_for
from test_graphs import cpu_pair, emulated_graphs, gpu_pair, needs_cuda  # noqa: F401 (fixtures)

from decoders import DecodeOptions, generate
from decoders.runtime.buffers import KVPlan
from decoders.runtime.graphs import bucket
from decoders.runtime.runner import CachedModel
from decoders.selfdraft.stem import run_layers, stem_layers, step_mask, target_rotary
from decoders.selfdraft.upper import UpperForward


@pytest.fixture(scope="module")
def tiny():
    from tiny import tiny_llama

    return tiny_llama(seed=5, layers=4)


def _stem_rows(runner: CachedModel, k: int, tokens: list[int]) -> torch.Tensor:
    """h_k (n, d) of `tokens` after the runner's cache, the stem's layers writing their slots (as the draft does)."""
    model, past = runner.model, runner.cache.layers[0].get_seq_length()
    ids = torch.tensor([tokens])  # (1, n)
    positions = torch.arange(past, past + len(tokens))[None]  # (1, n)
    hidden = model.get_input_embeddings()(ids)  # (1, n, d)
    mask = step_mask(len(tokens), past, hidden.dtype, ids.device)
    return run_layers(stem_layers(model, k), hidden, positions, mask, target_rotary(model), runner.cache)[0]


@pytest.mark.parametrize("k", [1, 2, 3])
@torch.inference_mode()
def test_layers_k_to_l_at_a_fixed_shape_give_the_full_forwards_logits(tiny, k):
    """Stem (layers 0..k-1) then the fixed-shape k..L-1 forward over its rows, round after round at widths 1..12,
    against the eager full forward of the same tokens after the same context: the same logits (float rounding of
    another key count aside), the same argmax, the upper layers' lengths moved by the rows alone."""
    model = tiny.model
    fixed = CachedModel(model, KVPlan("fixed", committed=120))
    full = CachedModel(model)
    context = [(7 * i) % 60 + 1 for i in range(19)]
    fixed.forward(context), full.forward(context)
    upper = UpperForward(model, k, target_rotary(model))
    for round_, n in enumerate((1, 3, 7, 12, 2)):
        tokens = [(round_ + 5 * i) % 60 + 1 for i in range(n)]
        rows = _stem_rows(fixed, k, tokens)  # (n, d)
        logits, features = upper(fixed.fixed, rows)
        want = full.forward(tokens)  # (n, V)
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(logits.argmax(-1), want.argmax(-1)) and features.shape == (n, model.config.hidden_size)
        assert fixed.cache.lengths() == [full.length] * 4, (round_, n)
    assert fixed.fixed.counts["eager"] == 6 + 0 and fixed.fixed.widths >= {bucket(12, fixed.plan.buckets)}


@torch.inference_mode()
def test_a_replayed_upper_forward_gives_the_eager_logits(tiny, emulated_graphs):
    """With graphs on, a width's second use captures and replays (emulated here): its logits are the eager ones at
    the same width, the upper layers advance by the real rows, and the graphs are kept with the target's buffer."""
    model = tiny.model
    graphs = CachedModel(model, KVPlan("fixed", committed=120, graphs=True))
    eager = CachedModel(model, KVPlan("fixed", committed=120))
    context = [(3 * i) % 60 + 1 for i in range(11)]
    upper = UpperForward(model, 2, target_rotary(model))
    for runner in (graphs, eager):
        runner.forward(context)
    for round_ in range(4):  # widths 4 (3 rows) then 4 again: eager, capture + replay, replay, replay
        tokens = [(round_ + 5 * i) % 60 + 1 for i in range(3)]
        got = upper(graphs.fixed, _stem_rows(graphs, 2, tokens))[0]
        want = upper(eager.fixed, _stem_rows(eager, 2, tokens))[0]
        assert torch.equal(got, want), round_
        assert graphs.cache.lengths() == eager.cache.lengths()
        for runner in (graphs, eager):
            runner.keep_path(3, [0, 1])  # as the loop compacts after a round
    assert graphs.fixed.counts["graph"] == 3 and ("upper", 2, 4) in graphs.fixed.others
    graphs.release()


def test_early_exit_verification_replays_graphs_and_decodes_what_eager_decodes(cpu_pair, emulated_graphs):
    """A whole early-exit run with graphs (emulated): verification replays captured k..L-1 forwards, where before
    it ran eagerly outside the graphs (only prefill chunks counted), and greedy and sampled ids equal the eager
    fixed run's and the baseline's."""
    for temperature in (0.0, 1.0):
        options = options_for("early exit", cpu_pair, kv_cache="fixed", temperature=temperature, seed=4)
        eager = generate(options, PROMPTS["long"], target=cpu_pair["target"], draft=cpu_pair["draft"])
        trace = generate(replace(options, cuda_graphs=True), PROMPTS["long"], target=cpu_pair["target"],
                         draft=cpu_pair["draft"])
        assert trace.output_ids == eager.output_ids, temperature
        assert trace.runtime["target"]["graph"] >= len(trace.rounds) - 2, trace.runtime  # all but a width's first
    baseline = generate(DecodeOptions(max_new_tokens=len(eager.output_ids)), PROMPTS["long"], target=cpu_pair["target"])
    greedy = generate(options_for("early exit", cpu_pair, kv_cache="fixed", cuda_graphs=True), PROMPTS["long"],
                      target=cpu_pair["target"], draft=cpu_pair["draft"])
    assert greedy.output_ids == baseline.output_ids[:len(greedy.output_ids)]


@needs_cuda
def test_early_exit_verification_is_captured_on_a_gpu(gpu_pair):
    """On CUDA the k..L-1 forward is really captured and replayed: output equal to the baseline, graph forwards for
    the rounds (before issue 46 early exit's graph count held prefill chunks only)."""
    for prompt in PROMPTS.values():
        baseline = generate(DecodeOptions(max_new_tokens=30, kv_cache="dynamic"), prompt, target=gpu_pair["target"])
        trace = generate(options_for("early exit", gpu_pair, cuda_graphs=True), prompt, target=gpu_pair["target"],
                         draft=gpu_pair["draft"])
        assert trace.output_ids == baseline.output_ids
        assert trace.runtime["target"]["graph"] >= len(trace.rounds) - 3, trace.runtime
