"""The shipped SmolLM2 self-drafters (assets/early-exit, assets/prophet) on the real model: found by "auto", greedy
output equal to the baseline token for token (float32), the early-exit trace records where the draft exits."""
from __future__ import annotations

import pytest

from decoders import DecodeOptions, generate

pytestmark = pytest.mark.slow
PROMPTS = ["Explain in three short sentences why the sky is blue.",
           "Write a Python function that returns the n-th Fibonacci number."]


@pytest.fixture(scope="module")
def smollm():
    from decoders.runtime.models import load_model

    return load_model("smollm2-135m", dtype="float32", device="cpu")


@pytest.mark.parametrize("drafter", ["early-exit", "prophet"])
def test_shipped_weights_decode_exactly_the_baseline(smollm, drafter):
    for prompt in PROMPTS:
        ids = smollm.encode_prompt(prompt, chat=True)
        base = generate(DecodeOptions(model="smollm2-135m", dtype="float32", max_new_tokens=40), ids, target=smollm)
        trace = generate(DecodeOptions(model="smollm2-135m", dtype="float32", method="speculative", drafter=drafter,
                                       rule="adaedl", max_new_tokens=40), ids, target=smollm)
        assert trace.output_ids == base.output_ids, (drafter, prompt)
        assert sum(r.n_drafted for r in trace.rounds) > 0
        info = trace.totals["self_draft"]
        assert info["kind"] == drafter and info["target_layers"] == 30
        if drafter == "early-exit":
            assert info["exit_layer"] == 2 and info["reused_layer_tokens"] > 0
