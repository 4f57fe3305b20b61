"""The Race's verification-cost panel: this machine's t(n)/t(1) beside the one measured on an H100 elsewhere.

This machine's curve is decoders.costs' cached measurement (the draft controller measures it on first use; nothing is
timed here). The H100's comes from a recorded benchmark in bench/results (dated, labelled "measured elsewhere"); when
that file or its curve is missing, the panel says so and shows only this machine's, never an invented one.
"""
from __future__ import annotations

import json
from pathlib import Path

from app.shared.paths import ROOT

ELSEWHERE = ROOT / "bench" / "results" / "quick-gpu-h100.json"  # `python -m bench --quick` on an H100 (its meta says)


def this_machine(model: str, dtype: str = "float32", device: str = "auto") -> dict | None:
    """{"label", "ns", "t", "measured_at"} from the cost cache for this model on `device` (the race's: a GPU's curve
    when the race ran on one; "auto" is where this process would run it), None if never measured there."""
    try:
        from decoders.costs import cached
        from decoders.runtime.models import resolve_device

        where = str(resolve_device(device).type)  # the cache keys GPU curves by the GPU's name, CPUs by theirs
        curve = cached(model, "float32" if dtype in ("auto", "", None) else dtype, device=where)  # auto: float32
    except Exception:  # no cache, or the cost module cannot load: nothing measured to show
        curve = None
    if curve is None:
        return None
    parts = curve.machine.split(", ")  # "AMD EPYC, 2 cores, 2 threads, PyTorch 2.13.0+cpu": short for a legend
    threads = next((part for part in parts if part.endswith("threads")), "")
    threads = "1 thread" if threads == "1 threads" else threads
    return {"label": f"this machine ({parts[0]}{', ' + threads if threads else ''})", "kernels": curve.kernels,
            "model": curve.model, "dtype": curve.dtype, "ns": list(curve.ns),
            "t": [curve.raw_chain.get(n, curve.chain[n]) for n in curve.ns], "measured_at": curve.measured_at[:10]}


def measured_elsewhere(path: Path = ELSEWHERE, dtype: str = "float32") -> dict | None:
    """The H100 benchmark's target t(n)/t(1) (None if the file or its curve is missing or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        meta = data["meta"]
        curve = data["runs"][dtype]["costs"]["target_curve"]
        points = sorted((int(n), float(t)) for n, t in curve["t"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    machine = (str(meta.get("machine", "")).split(", ")[-1] or "GPU").replace("NVIDIA ", "").split(" ")[0]
    return {"label": f"{machine}, measured elsewhere ({str(meta.get('date', ''))[:10]})", "model": _model(data, dtype),
            "dtype": dtype, "ns": [n for n, _ in points], "t": [t for _, t in points],
            "measured_at": str(meta.get("date", ""))[:10], "source": str(path.relative_to(ROOT))
            if path.is_relative_to(ROOT) else path.name}


def _model(data: dict, dtype: str) -> str:
    return str(data["runs"][dtype].get("models", {}).get("target", "?"))
