"""The memory budget (decoders/runtime/residency.py through decoders/runtime/models.py): LRU eviction, holds, memory returned.

The loader itself is replaced by random-init models built from configs (no download, no disk), so these tests
exercise the bookkeeping and the release of real tensors; test_real_models-style loads are in the last test.
"""
from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decoders import api
from decoders.runtime import models, residency
from decoders.runtime.models import LoadedModel, ModelError
from decoders.options import DecodeOptions


class ByteTokenizer:
    """Just what LoadedModel.decode needs."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)


def random_lm(name: str, hidden: int = 32, layers: int = 2, vocab: int = 64, intermediate: int = 64) -> LoadedModel:
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval().requires_grad_(False)
    return LoadedModel(name=name, model=model, tokenizer=ByteTokenizer(), device=torch.device("cpu"),
                       dtype=torch.float32, source="random init", load_seconds=0.0, eos_token_ids=(),
                       context_length=128)


BIG = dict(hidden=768, layers=6, vocab=16000, intermediate=3072)  # ~81M parameters: ~325 MB in float32


@pytest.fixture
def fake_loader(monkeypatch, private_residency):
    """models.load_model on random-init models, in a residency of the test's own (tests/conftest.py); records which
    names were really loaded (not served resident)."""
    loads = []

    def fake_load(name, dtype, device, say):
        loads.append(name)
        say(f"ready (random init {name})")
        return random_lm(name, **(BIG if "big" in name else {}))

    monkeypatch.setattr(models, "_load", fake_load)
    models.unload_all()
    yield loads
    models.unload_all()
    models.set_memory_budget(None)


def resident() -> list[str]:
    return [row["name"] for row in models.resident_models()]


def tiny_bytes() -> int:
    return residency.model_bytes(random_lm("probe").model)


# ---------------------------------------------------------------- eviction order and holds

def test_least_recently_used_is_evicted_first(fake_loader):
    models.set_memory_budget(2.5 * tiny_bytes() / 1e9)  # room for two
    a = models.load_model("fake/a", dtype="float32", device="cpu")
    models.load_model("fake/b", dtype="float32", device="cpu")
    assert models.load_model("fake/a", dtype="float32", device="cpu") is a  # a use: a is now the most recent
    messages = []
    models.load_model("fake/c", dtype="float32", device="cpu", progress=messages.append)
    assert resident() == ["fake/a", "fake/c"]  # b was least recently used
    assert any(m.startswith("unloading fake/b (") and "memory budget" in m for m in messages)
    assert fake_loader == ["fake/a", "fake/b", "fake/c"]


def test_a_held_model_is_not_evicted(fake_loader):
    models.set_memory_budget(2.5 * tiny_bytes() / 1e9)
    a = models.load_model("fake/a", dtype="float32", device="cpu")
    models.load_model("fake/b", dtype="float32", device="cpu")
    with models.hold(a):  # a is least recently used, but a decode is using it
        models.load_model("fake/c", dtype="float32", device="cpu")
        assert resident() == ["fake/a", "fake/c"]
        assert [row["held"] for row in models.resident_models()] == [True, False]
    models.load_model("fake/d", dtype="float32", device="cpu")  # released: a goes now
    assert resident() == ["fake/c", "fake/d"]


def test_reloading_an_evicted_model_says_why(fake_loader):
    models.set_memory_budget(1.5 * tiny_bytes() / 1e9)  # room for one
    models.load_model("fake/a", dtype="float32", device="cpu")
    models.load_model("fake/b", dtype="float32", device="cpu")
    messages = []
    models.load_model("fake/a", dtype="float32", device="cpu", progress=messages.append)
    assert messages[0].startswith("loading fake/a again (it was unloaded to stay within the ")
    assert messages[0].endswith(f"{residency.gb_text(1.5 * tiny_bytes())} memory budget)")
    assert fake_loader == ["fake/a", "fake/b", "fake/a"]


def test_a_model_bigger_than_the_budget_still_loads_and_says_so(fake_loader):
    models.set_memory_budget(0.5 * tiny_bytes() / 1e9)
    messages = []
    loaded = models.load_model("fake/a", dtype="float32", device="cpu", progress=messages.append)
    assert loaded.name == "fake/a" and resident() == ["fake/a"]
    assert any("more than the" in m and residency.ENV_BUDGET in m for m in messages)


def test_stream_holds_its_models_while_it_decodes(fake_loader):
    options = DecodeOptions(model="fake/a", max_new_tokens=3, dtype="float32", device="cpu")
    rounds = api.stream(options, [1, 2, 3])
    next(rounds)
    assert models.resident_models()[0]["held"] is True
    rounds.close()  # Stop: the generator's finally releases the hold
    assert models.resident_models()[0]["held"] is False
    list(api.stream(options, [1, 2, 3]))  # a run to the end releases it too
    assert models.resident_models()[0]["held"] is False


def test_whisper_models_share_the_budget_and_are_held_while_they_decode(fake_loader):
    """Whisper models (decoders/whisper/models.py) sit in the same resident set: counted, evicted LRU, held."""
    pytest.importorskip("whisper")
    from decoders.whisper.models import resident_whisper

    whisper = resident_whisper("whisper-tiny.en")
    assert resident() == ["whisper-tiny.en"] and resident_whisper("whisper-tiny.en") is whisper  # served resident
    whisper_bytes = residency.model_bytes(whisper.model)
    assert models.resident_models()[0]["gb"] == round(whisper_bytes / 1e9, 3) > 0.1  # tiny.en: ~0.15 GB float32
    models.set_memory_budget((whisper_bytes + 1.5 * tiny_bytes()) / 1e9)  # Whisper and one language model
    with models.hold(whisper):  # a transcription is running
        models.load_model("fake/a", dtype="float32", device="cpu")
        models.load_model("fake/b", dtype="float32", device="cpu")
        assert resident() == ["whisper-tiny.en", "fake/b"]  # fake/a went, the held Whisper stayed
    messages = []
    models.load_model("fake/c", dtype="float32", device="cpu", progress=messages.append)
    assert resident() == ["fake/b", "fake/c"]  # released: Whisper was least recently used
    assert any(m.startswith("unloading whisper-tiny.en (") for m in messages)
    assert resident_whisper("whisper-tiny.en") is not whisper  # loaded again, within the budget


# ---------------------------------------------------------------- memory really comes back

def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmRSS from Linux's /proc")
def test_eviction_returns_the_memory(fake_loader):
    models.set_memory_budget(1.0)
    gc.collect()
    before = rss_bytes()
    models.load_model("fake/big", dtype="float32", device="cpu")
    size = models.resident_models()[0]["gb"] * 1e9
    loaded = rss_bytes()
    assert size > 250e6 and loaded - before > 0.8 * size  # it really is resident
    models.set_memory_budget(0.01)  # now only something tiny fits: loading one evicts the big model
    models.load_model("fake/a", dtype="float32", device="cpu")
    assert resident() == ["fake/a"]
    after = rss_bytes()
    assert loaded - after > 0.8 * size, f"RSS {before / 1e6:.0f} -> {loaded / 1e6:.0f} -> {after / 1e6:.0f} MB"


# ---------------------------------------------------------------- the setting

def test_budget_setting_env_and_default(monkeypatch):
    cpu = torch.device("cpu")
    models.set_memory_budget(None)
    monkeypatch.delenv("SPECLAB_MEMORY_BUDGET_GB", raising=False)
    assert residency.memory_budget_bytes(cpu) == int(0.6 * residency.total_memory_bytes(cpu))
    monkeypatch.setenv("SPECLAB_MEMORY_BUDGET_GB", "3.5")
    assert models.memory_budget_gb("cpu") == pytest.approx(3.5)
    models.set_memory_budget(2)
    assert models.memory_budget_gb("cpu") == pytest.approx(2)  # the function wins over the environment
    models.set_memory_budget(None)
    monkeypatch.setenv("SPECLAB_MEMORY_BUDGET_GB", "lots")
    with pytest.raises(ModelError, match="SPECLAB_MEMORY_BUDGET_GB must be a positive number of gigabytes"):
        models.memory_budget_gb("cpu")
    with pytest.raises(ModelError, match="positive"):
        models.set_memory_budget(-1)


def test_model_bytes_counts_tied_weights_once():
    lm = random_lm("tied")
    params = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    assert residency.model_bytes(lm.model) >= params
    lm.model.lm_head.weight = lm.model.model.embed_tokens.weight
    assert residency.model_bytes(lm.model) < params  # the shared matrix is counted once


def test_model_bytes_of_a_fused_model_equals_the_stock_ones():
    """decoders/runtime/fused.py makes q/k/v and gate/up views of one joined storage: counted by their storages' whole size,
    a fused model weighs what the stock one does (counting the first view alone missed about a quarter)."""
    from decoders.runtime import fused
    from tiny import tiny_llama, tiny_qwen2

    for model in (tiny_llama(layers=2).model, tiny_qwen2(layers=2).model):  # Qwen2's q/k/v have biases, joined too
        stock = residency.model_bytes(model)
        assert fused.fuse(model) > 0
        assert residency.model_bytes(model) == stock


def test_model_bytes_counts_packed_weights():
    from decoders.runtime import kernels

    lm = random_lm("packed")
    dense = residency.model_bytes(lm.model)
    if kernels.pack(lm.model) == 0:
        pytest.skip("this torch build has no oneDNN packed linear")
    assert residency.model_bytes(lm.model) >= 0.9 * dense  # the packed copies replace the dense weights


def test_private_residency_keeps_the_shared_models_through_unload_all(monkeypatch, request):
    """tests/conftest.py's private_residency: unload_all inside it clears the test's own residency only."""
    shared = residency.Residency()  # stands in for the process's residency, which real-weight tests share
    monkeypatch.setattr(models, "_RESIDENT", shared)
    key = ("fake/shared", "float32", "cpu")
    shared.add(key, random_lm("fake/shared"), 1)
    private = request.getfixturevalue("private_residency")
    assert models._RESIDENT is private and models.resident_models() == []
    private.add(("fake/own", "float32", "cpu"), random_lm("fake/own"), 1)
    models.unload_all()
    assert models.resident_models() == [] and shared.get(key) is not None
