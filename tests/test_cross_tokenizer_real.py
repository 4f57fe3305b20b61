"""The cross-tokenizer drafter on the shipped weights: SmolLM2-135M (its own tokenizer) drafting for
Qwen2.5-Coder-1.5B, float32, greedy output equal to the baseline token for token; the real tokenizers spell every
probe and share tens of thousands of tokens. Loads the 1.5B (minutes on a 2-core CPU): marked slow."""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, generate, retokenize

pytestmark = pytest.mark.slow

CODE_PROMPT = "Write a Python function that checks whether a string is a palindrome."
CHAT_PROMPT = "Explain in two sentences why the sky is blue."


@pytest.fixture(scope="module")
def pair():
    from decoders.runtime.models import load_model

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield load_model("qwen2.5-coder-1.5b", dtype="float32"), load_model("smollm2-135m", dtype="float32")
    torch.set_num_threads(previous)


def test_the_real_tokenizers_spell_text_and_share_tokens():
    from decoders.runtime.models import load_tokenizer

    qwen, smol = (retokenize.spelling_of(load_tokenizer(n).tokenizer, n) for n in ("qwen2.5-coder-1.5b",
                                                                                  "smollm2-135m"))
    shared = retokenize.shared_pieces(smol, qwen, 49152, 151936)
    assert len(shared) > 30000  # byte-level BPE on both sides: most of SmolLM2's vocabulary is one Qwen token
    assert shared.target_of(2) == 151645  # SmolLM2's <|im_end|> is Qwen's end of turn


@pytest.mark.parametrize("prompt", [CODE_PROMPT, CHAT_PROMPT])
def test_smollm2_drafting_for_qwen_equals_the_baseline(pair, prompt):
    target, draft = pair
    base = generate(DecodeOptions(model="qwen2.5-coder-1.5b", max_new_tokens=32), prompt, target=target)
    for rule in ("static", "adaedl"):
        options = DecodeOptions(model="qwen2.5-coder-1.5b", method="speculative", drafter="cross-tokenizer",
                                rule=rule, draft_quant="none", max_new_tokens=32)
        trace = generate(options, prompt, target=target, draft=draft)
        assert trace.output_ids == base.output_ids, rule
        assert trace.totals["accepted"] > 0 and trace.totals["tau"] > 1.3  # the pair agrees often enough to help
        if prompt == CODE_PROMPT:  # code's whitespace runs split differently; plain English words often do not
            assert any(len(n["pieces"]) != 1 for r in trace.rounds if r.retokenized for n in r.retokenized["nodes"])


def test_token_healing_lets_the_draft_indent_after_a_line_break():
    """Qwen writes "):\n" as one token and the indentation after it; SmolLM2 spells a line break and an indent as
    "\n   " + " ...". Reading the text's bare "\n" the draft starts an unindented line (a code fence, here); with
    the "\n" healed its first draft is "\n   ", the indent the target writes next."""
    from decoders.drafters.cross_tokenizer import CrossTokenizerDrafter, _spelling
    from decoders.runtime.models import load_model, load_tokenizer
    from decoders.rules import StaticRule
    from decoders.sampling import Warp

    draft, qwen = load_model("smollm2-135m", dtype="float32"), load_tokenizer("qwen2.5-coder-1.5b")
    ids = qwen.tokenizer.encode('def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n\n'
                                'def sub(a, b):\n')
    assert qwen.tokenizer.decode(ids[-1:]) == "):\n"
    drafted = {}
    for heal in (True, False):
        drafter = CrossTokenizerDrafter(draft.model, _spelling(draft, "draft"), _spelling(qwen, "target"))
        if not heal:
            drafter.prefixes = None
        drafter.start(ids)
        proposal = drafter.propose(ids, 4, StaticRule(4), Warp(0.0), None, True)
        drafted[heal] = qwen.tokenizer.decode(proposal.tree.tokens[1:])
        assert proposal.retokenized["context"]["healed"] == ("\n" if heal else "")
    assert drafted[True].startswith("    ") and not drafted[False][:1].isspace(), drafted
