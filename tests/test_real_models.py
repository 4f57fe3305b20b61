"""End to end on the shipped real weights, float32 (exact): every lossless method equals the baseline.

These load real models (seconds from the converted cache; about a minute the first time), so they are marked
slow; `make test` and CI still run them.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from decoders import DecodeOptions, Trace, generate

pytestmark = pytest.mark.slow

COPY_PROMPT = ("Repeat this list exactly, one per line: apple, banana, cherry, date, elderberry, fig, grape, "
               "honeydew, kiwi, lemon.")
CHAT_PROMPT = "Explain in two sentences why the sky is blue."
CODE_PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively."


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def smollm():
    from decoders.runtime.models import load_model

    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="module")
def qwen_pair():
    from decoders.runtime.models import load_model

    return load_model("qwen2.5-coder-1.5b", dtype="float32"), load_model("qwen2.5-coder-0.5b", dtype="float32")


@pytest.mark.parametrize("prompt", [COPY_PROMPT, CHAT_PROMPT])
def test_smollm2_lookup_and_layer_skip_equal_baseline(smollm, prompt):
    base = generate(DecodeOptions(model="smollm2-135m", max_new_tokens=40), prompt, target=smollm)
    assert len(base.output_ids) > 5
    for drafter, rule in [("prompt-lookup", "static"), ("prompt-lookup", "heuristic"), ("layer-skip", "static"),
                          ("layer-skip", "adaedl")]:
        options = DecodeOptions(model="smollm2-135m", method="speculative", drafter=drafter, rule=rule, gamma=4,
                                max_new_tokens=40)
        trace = generate(options, prompt, target=smollm)
        assert trace.output_ids == base.output_ids, (drafter, rule)
        assert trace.output_text == base.output_text
    lookup = generate(DecodeOptions(model="smollm2-135m", method="speculative", drafter="prompt-lookup",
                                    max_new_tokens=40), COPY_PROMPT, target=smollm)
    assert lookup.totals["accepted"] > 0  # a copy task gives prompt lookup something to accept


def test_qwen_pair_draft_model_equals_baseline(qwen_pair):
    target, draft = qwen_pair
    base = generate(DecodeOptions(model="qwen2.5-coder-1.5b", max_new_tokens=32), CODE_PROMPT, target=target)
    for rule in ("static", "adaedl"):
        options = DecodeOptions(model="qwen2.5-coder-1.5b", method="speculative", drafter="draft-model", rule=rule,
                                max_new_tokens=32)
        trace = generate(options, CODE_PROMPT, target=target, draft=draft)
        assert trace.output_ids == base.output_ids, rule
        assert trace.totals["acceptance_rate"] > 0.3  # the real pair agrees on code most of the time
        assert trace.totals["tau"] > 1.5


@pytest.mark.parametrize("tree", [dict(drafter="eagle2", tree_k=4, tree_depth=4, tree_m=16),
                                  dict(drafter="ddd", tree_k=4, tree_m=16, ddd_steps=6, ddd_width=4)])
def test_qwen_pair_draft_model_trees_equal_baseline(qwen_pair, tree):
    """EAGLE-2 and DDD trees grown by the real 0.5B draft, verified by the 1.5B in float32: the baseline's tokens."""
    target, draft = qwen_pair
    base = generate(DecodeOptions(model="qwen2.5-coder-1.5b", max_new_tokens=24), CODE_PROMPT, target=target)
    options = DecodeOptions(model="qwen2.5-coder-1.5b", method="speculative", max_new_tokens=24, **tree)
    trace = generate(options, CODE_PROMPT, target=target, draft=draft)
    assert trace.output_ids == base.output_ids
    assert trace.totals["tau"] > 1.5  # the real pair's trees are accepted past their root


@pytest.mark.parametrize("drafter", ["eagle1", "eagle2", "ddd"])
def test_smollm2_trees_from_the_shipped_head_equal_baseline(smollm, drafter):
    """The shipped EAGLE head (assets/eagle/smollm2-135m) grows real trees; float32 verification keeps greedy."""
    base = generate(DecodeOptions(max_new_tokens=24), CHAT_PROMPT, target=smollm)
    options = DecodeOptions(method="speculative", drafter=drafter, eagle_head="auto", max_new_tokens=24)
    trace = generate(options, CHAT_PROMPT, target=smollm)
    assert trace.output_ids == base.output_ids
    assert trace.totals["tau"] > 1.2 and trace.rounds[0].search["pool"]  # drafts accepted past the root


def test_tokenizer_mismatch_is_a_clear_error(smollm, qwen_pair):
    from decoders.runtime.models import ModelError, check_tokenizers_compatible

    with pytest.raises(ModelError, match="same family|vocabulary|tokenizer"):
        check_tokenizers_compatible(smollm, qwen_pair[1])
    check_tokenizers_compatible(qwen_pair[0], qwen_pair[1])  # the real pair shares one tokenizer


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "trace.json"
    result = subprocess.run(
        [sys.executable, "-m", "decoders", "run", "--model", "smollm2-135m", "--method", "speculative",
         "--drafter", "prompt-lookup", "--prompt", COPY_PROMPT, "--max-new-tokens", "24", "--dtype", "float32",
         "--trace", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "tokens=24" in result.stdout and "tau=" in result.stdout and "acceptance=" in result.stdout
    trace = Trace.from_json(out.read_text())
    assert trace.output_text in result.stdout and trace.models["target"]["dtype"] == "float32"
    assert json.loads(out.read_text())["schema_version"] == 1


def test_cli_lists_models():
    result = subprocess.run([sys.executable, "-m", "decoders", "models"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for name in ("smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m"):
        assert name in result.stdout
