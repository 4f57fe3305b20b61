"""Interleaved, repeated runs of SpecLab methods and their Hugging Face peers on the same prompts.

One clock for everyone. SpecLab runs go through `decoders.stream` (the same loop the UI uses); HF peers through a
streamer (bench/peers.py). Decode time runs from the first delivered batch of tokens (prefill plus the first
round) to the end of the call; decode tokens are the tokens delivered after that first batch. That is
"decode-only tokens/s after prefill" measured the same way for both sides, and it includes everything a user
waits for (drafting, verification, bookkeeping, the trace recording). The trace's own figure
(`trace_tok_s` = totals.tokens_per_second, which counts the first round too) is kept next to it.

Noise: the machine is shared, so every figure that matters is a ratio of two runs made close together in time:
in each repetition every method runs once per prompt, in an order that rotates between repetitions and prompts,
and speedups are per-repetition ratios (method / baseline of the same repetition and prompt), summarized by their
median and range.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch

from decoders.runtime import kernels

from . import peers
from .common import Prompt


@dataclass(frozen=True)
class Method:
    key: str  # unique id, e.g. "ours/draft-model"
    label: str
    family: str  # "ours" | "hf"
    kind: str  # "baseline" | "draft-model" | "prompt-lookup" | "layer-skip"
    options: dict = field(default_factory=dict)  # ours: DecodeOptions fields; hf: generate settings (bench/peers.py)
    record: bool = True  # ours: trace recording on/off
    temperature: float = 0.0
    peer: str | None = None  # the HF method this one is compared against on the same kernels (the headline)
    baseline: str = "ours/baseline"  # speedups are measured against this method (temperature-0 baseline)
    kernels: str = "packed"  # matmul kernels the models run on: "packed" (SpecLab's, decoders/runtime/kernels.py) | "stock"
    peer_stock: str | None = None  # the same HF method as users run it (stock kernels): the second column
    # The draft's precision, for both families ("auto" | "int8" | "none", decoders/quantize.py): run_draft hands the
    # same object to SpecLab and to transformers for the same value, so a comparison never pits an int8 draft
    # against a float32 one. Ours also carry it in options (DecodeOptions.draft_quant, recorded in the trace).
    draft_quant: str = "auto"

    @property
    def needs_draft(self) -> bool:
        """Ours: the registry says (decoders/registry.py); HF: assisted generation takes the draft model."""
        if self.family == "hf":
            return HF_KIND.get(self.kind) == "assisted"
        from decoders import DecodeOptions, registry

        return registry.uses_draft_model(DecodeOptions(**self.options))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def ours(key: str, label: str, kind: str, record: bool = True, temperature: float = 0.0, peer: str | None = None,
         kernels: str = "packed", peer_stock: str | None = None, **options) -> Method:
    if not record and "no trace" not in label:
        label += ", no trace"  # the recording-off twin of a method: never two rows with one name
    if kind == "baseline":
        options = {"method": "baseline", **options}
    else:
        options = {"method": "speculative", "drafter": kind, **options}
    return Method(key, label, "ours", kind, options, record, temperature, peer, kernels=kernels,
                  peer_stock=peer_stock, draft_quant=options.get("draft_quant", "auto"))


def hf(key: str, label: str, kind: str, kernels: str = "stock", temperature: float = 0.0, draft_quant: str = "auto",
       **settings) -> Method:
    """An HF peer; `settings` go to generate (bench/peers.py). kernels "stock" = transformers as users run it,
    "packed" = on SpecLab's kernels, the equal-terms comparison. draft_quant: the draft it is handed, by the same
    rule as SpecLab's (run_draft)."""
    return Method(key, label, "hf", kind, dict(settings), True, temperature, None, kernels=kernels,
                  draft_quant=draft_quant)


HF_KIND = {"baseline": "greedy", "draft-model": "assisted", "prompt-lookup": "prompt-lookup", "early-exit": "early-exit"}


# --- one run ---------------------------------------------------------------------------------------------------

def run_ours(method: Method, target, prompt: Prompt, max_new_tokens: int, draft=None, seed: int = 0) -> dict:
    """One SpecLab run; `draft` is the object run_draft chose (None when the method drafts without one)."""
    from decoders import DecodeOptions, stream

    options = DecodeOptions(model=getattr(target, "name", "target"), max_new_tokens=max_new_tokens,
                            record=method.record, temperature=method.temperature, seed=seed, **method.options)
    start = time.perf_counter()
    trace = None
    for trace in stream(options, prompt.ids, target=target, draft=draft, store=prompt.store):
        pass
    end = time.perf_counter()
    totals = trace.totals
    forwards = forwards_with_prefill(totals["target_forwards"], len(prompt.ids))
    # The clock's steady reading (decoders/clock.py), the one transformers' side is read with too (bench/peers.py).
    first_tokens = len(trace.rounds[0].committed) if trace.rounds else 0
    decode_tokens = len(trace.output_ids) - first_tokens
    steady = totals.get("steady_tokens_per_second")
    decode_seconds = decode_tokens / steady if steady else 0.0
    return {
        "output_ids": list(trace.output_ids),
        "n_tokens": len(trace.output_ids),
        "decode_tokens": decode_tokens,
        "decode_seconds": decode_seconds,
        "tok_s": decode_tokens / decode_seconds if decode_tokens > 0 and decode_seconds > 0 else None,
        "trace_tok_s": totals.get("tokens_per_second"),
        "trace_decode_seconds": trace.decode_seconds,
        "prefill_seconds": trace.prefill_seconds,
        "wall_seconds": end - start,
        "target_forwards": forwards,
        "draft_forwards": totals["draft_forwards"],
        "tau": len(trace.output_ids) / forwards if forwards else None,
        "trace_tau": totals["tau"],  # the trace's own τ: tokens ÷ verification forwards (the prefill left out)
        "drafted": totals["drafted"],
        "accepted": totals["accepted"],
        "acceptance_rate": totals["acceptance_rate"],
        "phase_seconds": totals["seconds"],
        "peak_kv_bytes": totals.get("peak_kv_bytes"),
        "recorder_seconds": totals.get("record_seconds"),
        "controller_caps": [rnd.rule["controller"]["cap"] for rnd in trace.rounds
                            if rnd.rule and "controller" in rnd.rule],
        "stop_reason": trace.stop_reason,
        "runtime": trace.runtime,  # how each model's forwards ran (graph or eager, padded widths: decoders/runtime/graphs.py)
        "rounds_first_tokens": first_tokens,
        "rounds": [[r.n_drafted, r.n_accepted] for r in trace.rounds],  # α by depth (bench/self_drafters.py)
    }


def run_draft(method: Method, draft):
    """The draft object a run decodes with, by one rule for both families: SpecLab's method and transformers' peer
    with the same draft_quant get the very same module (transformers' assisted generation only calls the draft's
    forward, so it runs an int8 draft as well as a float32 one). A comparison with transformers is on equal terms
    only with the same draft weights: an int8 draft against a float32 one measures the int8 kernel."""
    if draft is None or not method.needs_draft:
        return None
    return quantized_draft(method.draft_quant, draft)


def quantized_draft(draft_quant: str, draft):
    """The draft as the API would load it for this draft_quant: int8 where asked (or, for "auto", where this machine
    measured it faster; decoders/quantize.py). Only registry drafts: tests' tiny ones stay as they are."""
    from decoders import quantize
    from decoders.runtime import models

    if draft is None or draft_quant == "none" or getattr(draft, "name", None) not in models.REGISTRY \
            or draft.dtype != torch.float32 or draft.device.type != "cpu":
        return draft
    quant = quantize.resolve(draft_quant, draft.name, "cpu",
                             lambda name, q: models.load_model(name, dtype="float32", quant=q))
    return models.load_model(draft.name, dtype="float32", quant=quant) if quant else draft


def draft_precision(draft) -> dict:
    """What the run's draft was, read from the object itself: {"draft_precision": "int8" | "float32" | …,
    "draft_kernels": "int8" | "packed" | "stock"}; None for both when the run had no draft."""
    if draft is None:
        return {"draft_precision": None, "draft_kernels": None}
    kind = kernels.kernels_of(draft.model)
    dtype = str(next(draft.model.parameters()).dtype).removeprefix("torch.")
    return {"draft_precision": "int8" if kind == kernels.INT8 else dtype, "draft_kernels": kind}


def forwards_with_prefill(verify_forwards: int, prompt_len: int) -> int:
    """Target forward calls of a SpecLab run, counted like HF's (every call): the verification forwards the trace
    records, plus the prefill call over all prompt tokens but the last (none for a one-token prompt)."""
    return verify_forwards + (1 if prompt_len > 1 else 0)


def run_one(method: Method, models: dict, prompt: Prompt, max_new_tokens: int, seed: int = 0) -> dict:
    target, draft = models["target"], models.get("draft")
    if method.needs_draft and draft is None:
        raise ValueError(f"{method.key} needs a draft model")
    use_kernels(models, method.kernels)  # outside every timed region
    draft = run_draft(method, draft)  # loads (once per process) outside the timed region too
    if method.family == "ours":
        result = run_ours(method, target, prompt, max_new_tokens, draft, seed)
    else:
        result = peers.run_peer(HF_KIND[method.kind], target, prompt.ids, max_new_tokens, draft, method.options,
                                method.temperature, seed)
    result.update({"method": method.key, "family": method.family, "label": method.label, "kind": method.kind,
                   "record": method.record, "temperature": method.temperature, "seed": seed,
                   "prompt": prompt.id, "prompt_kind": prompt.kind, "prompt_tokens": len(prompt.ids),
                   "draft_quant": method.draft_quant if draft is not None else None, **draft_precision(draft)})
    return result


# --- the suite -------------------------------------------------------------------------------------------------

def rotate(items: list, k: int) -> list:
    k %= max(1, len(items))
    return items[k:] + items[:k]


def use_kernels(models: dict, kind: str) -> None:
    """Put every loaded model on `kind` kernels (packing is a no-op where it does not apply, e.g. bfloat16)."""
    for loaded in models.values():
        kernels.use(loaded.model, kind)


def run_order(methods: list[Method], k: int) -> list[Method]:
    """Rotate within each kernel group and alternate which group goes first: two kernel switches per prompt at most
    (a switch re-lays-out every weight: seconds for the 1.5B), and no method always runs first or last."""
    groups = [rotate([m for m in methods if m.kernels == kind], k) for kind in ("packed", "stock")]
    other = [m for m in methods if m.kernels not in ("packed", "stock")]
    first, second = (groups[0], groups[1]) if k % 2 == 0 else (groups[1], groups[0])
    return first + second + other


def run_suite(methods: list[Method], models: dict, prompts: list[Prompt], reps: int, max_new_tokens: int,
              log=print, warmup: bool = True, on_record=None) -> list[dict]:
    """Every method on every prompt, `reps` times, interleaved. Returns one raw record per run."""
    target = models["target"]
    for prompt in prompts:
        if not prompt.ids:
            prompt.ids = target.encode_prompt(prompt.text, chat=True)
    if warmup:  # first calls pay one-off costs (allocator, kernels, lazy imports): keep them out of the figures
        for method in warmup_set(methods):
            run_one(method, models, prompts[0], min(4, max_new_tokens))
    records = []
    total = reps * len(prompts) * len(methods)
    done = 0
    for rep in range(reps):
        for p_index, prompt in enumerate(prompts):
            for method in run_order(methods, rep * len(prompts) + p_index):
                seed = rep if not method.greedy else 0
                result = run_one(method, models, prompt, max_new_tokens, seed)
                result["rep"] = rep
                records.append(result)
                if on_record is not None:  # e.g. save a partial file, so a long run that is stopped keeps its data
                    on_record(records)
                done += 1
                tok_s = result["tok_s"]
                log(f"  [{done}/{total}] rep {rep} {prompt.id:<16} {method.key:<28} "
                    f"{(f'{tok_s:6.2f}' if tok_s else '   n/a')} tok/s  tau {_fmt(result['tau'])}")
    mark_identity(records)
    return records


def warmup_set(methods: list[Method]) -> list[Method]:
    """One method per code path (family, drafter, kernels, draft precision, greedy or not): one-off costs belong to
    the path, not to a setting, and a tuning grid of 18 settings should not pay 18 warm-up prefills."""
    seen = {}
    for m in methods:
        seen.setdefault((m.family, m.kind, m.kernels, m.draft_quant if m.needs_draft else None, m.greedy, m.record), m)
    return list(seen.values())


def mark_identity(records: list[dict]) -> None:
    """identical_to_baseline: same ids as our greedy baseline on that prompt; also vs HF greedy; first divergence."""
    reference = {}
    for key in ("ours/baseline", "hf/greedy"):
        for r in records:
            if r["method"] == key and r["prompt"] not in reference.get(key, {}):
                reference.setdefault(key, {})[r["prompt"]] = r["output_ids"]
    for r in records:
        for key, field_name in (("ours/baseline", "identical_to_baseline"), ("hf/greedy", "identical_to_hf_greedy")):
            ref = reference.get(key, {}).get(r["prompt"])
            if ref is None or r["temperature"] != 0.0:
                r[field_name] = None
                continue
            r[field_name] = r["output_ids"] == ref
            if key == "ours/baseline":
                r["first_divergence"] = _first_divergence(r["output_ids"], ref)


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _fmt(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "n/a"


# --- memory -----------------------------------------------------------------------------------------------------

def available_gib() -> float:
    """MemAvailable from /proc/meminfo (GiB); inf where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def free_models(models: dict) -> None:
    """Drop every reference we hold and collect, so the next dtype never coexists with this one."""
    models.clear()
    try:  # decoders.runtime.models keeps one copy per (name, dtype) per process: forget those too
        from decoders.runtime import models as registry

        registry.unload_all()
    except ImportError:
        pass
    gc.collect()


def set_threads(n: int | None) -> int:
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def describe(method: Method) -> dict:
    """Plain-data description of a method for the JSON (and for the report's predicted-speedup columns)."""
    return {"key": method.key, "label": method.label, "family": method.family, "kind": method.kind,
            "record": method.record, "temperature": method.temperature, "peer": method.peer,
            "peer_stock": method.peer_stock, "baseline": method.baseline, "options": dict(method.options),
            "kernels": method.kernels, "draft_quant": method.draft_quant if method.needs_draft else None,
            "rule": method.options.get("rule", "static") if method.family == "ours" and method.kind != "baseline"
            else None,
            "gamma": method.options.get("gamma", 4) if method.family == "ours" and method.kind != "baseline"
            else None}
