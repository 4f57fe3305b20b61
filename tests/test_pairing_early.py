"""A draft of another family fails on its tokenizer, before any weights load (decoders/api.py, decoders/runtime/models.py)."""
from __future__ import annotations

import time

import pytest

from decoders import api
from decoders.runtime import models
from decoders.runtime.models import ModelError, TokenizerOnly
from decoders.options import DecodeOptions


class FakeTokenizer:
    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def __len__(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)


@pytest.fixture
def no_weights(monkeypatch, private_residency):
    """Any attempt to load weights fails the test (in a residency of its own: unload_all leaves the shared models)."""
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the tokenizers were compared")

    monkeypatch.setattr(models, "_load", refuse)
    monkeypatch.setattr(models, "read_gguf", refuse)
    models.unload_all()


def pair_options(target: str, draft: str) -> DecodeOptions:
    return DecodeOptions(model=target, method="speculative", drafter="draft-model", draft_model=draft,
                         dtype="float32", device="cpu")


def test_mismatched_registry_tokenizers_fail_before_weights(no_weights, monkeypatch):
    tokenizers = {"qwen2.5-coder-1.5b": TokenizerOnly("qwen2.5-coder-1.5b", FakeTokenizer({"a": 0, "<e>": 1}), (1,)),
                  "smollm2-135m": TokenizerOnly("smollm2-135m", FakeTokenizer({"b": 0}), (0,))}
    monkeypatch.setattr(models, "load_tokenizer", lambda name: tokenizers[models._canonical_name(name)])
    with pytest.raises(ModelError, match="'smollm2-135m' cannot draft for target 'qwen2.5-coder-1.5b'"):
        api.generate(pair_options("qwen2.5-coder-1.5b", "SmolLM2-135M"), "def f():")


def test_draft_passed_in_or_not_in_the_registry_is_left_to_the_loaded_check(no_weights, monkeypatch):
    def no_tokenizer(name):
        raise AssertionError("read a tokenizer that only the loaded-model check can judge")

    monkeypatch.setattr(models, "load_tokenizer", no_tokenizer)
    api.check_draft_before_loading(pair_options("qwen2.5-coder-1.5b", "someorg/some-draft"))
    api.check_draft_before_loading(DecodeOptions(model="qwen2.5-coder-1.5b"))  # baseline: no draft at all


@pytest.mark.slow
def test_real_qwen_target_with_smollm2_draft_fails_fast(no_weights):
    """Real tokenizers (Qwen's is read from its GGUF once, ~40 s, then cached); the Qwen weights never load."""
    models.load_tokenizer("qwen2.5-coder-1.5b")  # the one-time vocabulary read is not what this test times
    start = time.perf_counter()
    with pytest.raises(ModelError, match="choose a draft from the same family: qwen2.5-coder-0.5b"):
        api.generate(pair_options("qwen2.5-coder-1.5b", "smollm2-135m"), "def add(a, b):")
    assert time.perf_counter() - start < 20
