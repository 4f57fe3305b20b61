"""Self-drafters' draft steps at one fixed shape (issue 46), over decoders/runtime/steps.StepGraph: the prophet's
(decoders/drafters/prophet.FixedRound) and early exit's later greedy steps (decoders/selfdraft/exit_step.py).

With a fixed KV plan the prophet's round cache is one buffer and every draft step one row at a slot a device counter
holds, so a step needs nothing from the host and one captured graph replays every step of every round. On the CPU the
same function runs eagerly; the capture is emulated as tests/test_graphs.py does (and, unlike its fixture, with the
two warm-ups a real capture runs, so state a step moves must be put back); a real capture runs under needs_cuda.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kv_helpers import PROMPTS, options_for
from test_graphs import cpu_pair, emulated_graphs, gpu_pair, needs_cuda  # noqa: F401 (fixtures)
from transformers import DynamicCache

from decoders import DecodeOptions, generate
from decoders.drafters.prophet import FixedRound
from decoders.selfdraft.heads import Prophet
from decoders.selfdraft.stem import step_mask


@pytest.fixture(scope="module")
def prophet():
    from tiny import tiny_llama

    torch.manual_seed(0)
    return Prophet(tiny_llama(seed=5, layers=4).model, 2)


def _dynamic_round(model, rows: torch.Tensor) -> torch.Tensor:
    """The prophet's steps as before: a DynamicCache a round, one row a step. -> (n, N|V)"""
    cache, out = DynamicCache(config=model.config), []
    for past, row in enumerate(rows):
        positions = torch.tensor([[past]])
        out.append(model(row[None, None], positions, step_mask(1, past, row.dtype, row.device), cache)[0, -1])
    return torch.stack(out)


@torch.inference_mode()
def test_a_fixed_round_gives_the_dynamic_rounds_logits(prophet):
    """Rounds of 6, then 2, then 4 steps over one buffer: the stale rows of a longer round stay unseen."""
    fixed = FixedRound(prophet, 8, graphs=False)
    for seed, n in ((1, 6), (2, 2), (3, 4)):
        rows = torch.randn(n, prophet.config.hidden_size, generator=torch.Generator().manual_seed(seed))
        fixed.start_round()
        got = torch.stack([fixed(row[None]) for row in rows])
        want = _dynamic_round(prophet, rows)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1)) and int(fixed.slot) == n


@pytest.fixture
def warmed_capture(monkeypatch):
    """A CPU stand-in for graphs.capture that, like torch's, runs the forward twice before capturing it (the
    warm-ups) and once more for the captured outputs; a replay reruns it into those outputs."""
    from decoders.runtime import graphs

    class Replay:
        def __init__(self, forward, outputs):
            self.forward, self.outputs = forward, outputs

        def replay(self):
            for static, new in zip(self.outputs, self.forward()):
                if static is not None:
                    static.copy_(new)

    def capture(forward, pool=None):
        forward(), forward()
        outputs = forward()
        return Replay(forward, outputs), outputs, pool

    monkeypatch.setattr(graphs, "capture", capture)


@torch.inference_mode()
def test_a_captured_step_replays_the_eager_steps_and_puts_its_counter_back(prophet, warmed_capture):
    """The first step runs eagerly, the second captures (three runs that move the slot) and replays: the slot
    counts one per step, and every step's logits equal the eager round's."""
    eager, graphs = FixedRound(prophet, 8, graphs=False), FixedRound(prophet, 8, graphs=True)
    rows = torch.randn(5, prophet.config.hidden_size, generator=torch.Generator().manual_seed(4))
    for round_ in range(2):
        eager.start_round(), graphs.start_round()
        for i, row in enumerate(rows):
            assert torch.equal(graphs(row[None]), eager(row[None])), (round_, i)
            assert int(graphs.slot) == i + 1
    assert graphs.step.counts == {"graph": 9, "eager": 1}


def test_prophet_runs_with_graphs_replay_its_steps_and_decode_what_eager_decodes(cpu_pair, emulated_graphs):
    """A whole prophet run, fixed plan, graphs emulated: its draft steps replay one captured step (before, each
    step ran eagerly on a DynamicCache), greedy and sampled ids equal the eager fixed run's, greedy the baseline's."""
    for temperature in (0.0, 1.0):
        options = options_for("prophet", cpu_pair, kv_cache="fixed", temperature=temperature, seed=4)
        eager = generate(options, PROMPTS["long"], target=cpu_pair["target"], draft=cpu_pair["draft"])
        trace = generate(replace(options, cuda_graphs=True), PROMPTS["long"], target=cpu_pair["target"],
                         draft=cpu_pair["draft"])
        assert trace.output_ids == eager.output_ids, temperature
        draft = trace.runtime["draft"]
        assert draft["graph"] > 0 and draft["graph"] + draft["eager"] == sum(r.draft_forwards for r in trace.rounds)
        if temperature == 0.0:
            baseline = generate(DecodeOptions(max_new_tokens=len(trace.output_ids)), PROMPTS["long"],
                                target=cpu_pair["target"])
            assert trace.output_ids == baseline.output_ids


@needs_cuda
def test_prophet_steps_are_captured_on_a_gpu(gpu_pair):
    for prompt in PROMPTS.values():
        baseline = generate(DecodeOptions(max_new_tokens=30, kv_cache="dynamic"), prompt, target=gpu_pair["target"])
        trace = generate(options_for("prophet", gpu_pair, cuda_graphs=True), prompt, target=gpu_pair["target"],
                         draft=gpu_pair["draft"])
        assert trace.output_ids == baseline.output_ids
        assert trace.runtime["draft"]["graph"] > 0, trace.runtime


def test_early_exit_drafts_its_later_steps_at_one_shape_with_the_same_drafts(cpu_pair):
    """A fixed plan, eagerly: every round's draft steps after the first run FixedExitStep (the stem over the
    target's buffer, the block over its own), and each round drafts what the DynamicCache path drafts."""
    options = options_for("early exit", cpu_pair, kv_cache="dynamic")
    dynamic = generate(options, PROMPTS["long"], target=cpu_pair["target"], draft=cpu_pair["draft"])
    fixed = generate(replace(options, kv_cache="fixed"), PROMPTS["long"], target=cpu_pair["target"],
                     draft=cpu_pair["draft"])
    assert fixed.output_ids == dynamic.output_ids
    assert [[n.token for n in r.nodes] for r in fixed.rounds] == [[n.token for n in r.nodes] for r in dynamic.rounds]
    steps = fixed.runtime["draft"]
    assert steps["eager"] == sum(max(r.draft_forwards - 1, 0) for r in fixed.rounds) > 0 and steps["graph"] == 0


def test_early_exit_runs_with_graphs_replay_its_draft_step(cpu_pair, emulated_graphs):
    for temperature in (0.0, 1.0):
        options = options_for("early exit", cpu_pair, kv_cache="fixed", temperature=temperature, seed=4)
        eager = generate(options, PROMPTS["long"], target=cpu_pair["target"], draft=cpu_pair["draft"])
        trace = generate(replace(options, cuda_graphs=True), PROMPTS["long"], target=cpu_pair["target"],
                         draft=cpu_pair["draft"])
        assert trace.output_ids == eager.output_ids, temperature
        assert trace.runtime["draft"]["graph"] > 0, trace.runtime  # greedy and sampled chains feed device tokens


@needs_cuda
def test_early_exit_draft_steps_are_captured_on_a_gpu(gpu_pair):
    for prompt in PROMPTS.values():
        baseline = generate(DecodeOptions(max_new_tokens=30, kv_cache="dynamic"), prompt, target=gpu_pair["target"])
        trace = generate(options_for("early exit", gpu_pair, cuda_graphs=True), prompt, target=gpu_pair["target"],
                         draft=gpu_pair["draft"])
        assert trace.output_ids == baseline.output_ids
        assert trace.runtime["draft"]["graph"] > 0, trace.runtime
