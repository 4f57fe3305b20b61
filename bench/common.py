"""What every bench script shares and nothing in bench/ imports back: paths, the prompt kinds and their files, the
Prompt type, the machine's name and how loaded it was during a run.

It imports no other bench module (tests/test_import_cycles.py keeps bench/ and app/ free of import circles), so any
script, the claims table and the app can read it.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets" / "bench"
RESULTS = Path(__file__).resolve().parent / "results"
KIND_FILES = {"code-writing": "code_writing.json", "code-editing": "code_editing.json", "chat": "chat.json"}
CODE_KINDS = ("code-writing", "code-editing")
NOREC = ":norec"  # a method's recording-off twin: it measures the trace's cost, not the method


@dataclass
class Prompt:
    id: str
    kind: str
    text: str
    ids: list[int] = field(default_factory=list)
    store: object | None = None  # earlier outputs suffix decoding may draft from (decoders SuffixStore; bench/suffix.py)


def load_prompts(per_kind: int, kinds=None, split: str = "prompts") -> list[Prompt]:
    """The first `per_kind` prompts of each kind; split "prompts" = scored, "tuning" = for choosing settings."""
    prompts = []
    for kind, name in KIND_FILES.items():
        if kinds and kind not in kinds:
            continue
        data = json.loads((ASSETS / name).read_text(encoding="utf-8"))
        for entry in data.get(split, [])[:per_kind]:
            prompts.append(Prompt(entry["id"], data["kind"], entry["text"]))
    return prompts


def machine() -> str:
    """The CPU's model name, its cores and the GPU (or "no GPU")."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}"


# --- how busy the machine was ----------------------------------------------------------------------------------------

# A run keeps its own threads busy, so on a machine to itself the one-minute load per core sits near
# threads ÷ cores (≤ 1). Above QUIET_PER_CORE something else was running too: the run shared the CPU.
QUIET_PER_CORE = 1.25


class LoadMeter:
    """Samples the one-minute load average per core every `every` seconds while a run goes on (a daemon thread).

        with LoadMeter() as load:
            ...run...
        settings["load"] = load.summary()   # {"per_core": {min, median, max}, "samples", "label"}

    or load = LoadMeter().start() ... settings["load"] = load.stop() around a run that is not one block.
    """

    def __init__(self, every: float = 15.0):
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True, name="bench-load-meter")

    def start(self) -> "LoadMeter":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling (one last sample) and return the summary."""
        self._stop.set()
        self._thread.join(timeout=self.every + 1)
        self.sample()
        return self.summary()

    def __enter__(self) -> "LoadMeter":
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self._stop.is_set():
            self.stop()

    def sample(self) -> None:
        try:
            self.samples.append(os.getloadavg()[0] / (os.cpu_count() or 1))
        except OSError:  # no load average on this platform: the label then says so
            pass

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def summary(self) -> dict:
        return load_summary(self.samples)


def load_summary(samples: list[float]) -> dict:
    """{"per_core": {min, median, max} | None, "samples": n, "label": "quiet machine (…)" | "shared machine (…)"}."""
    if not samples:
        return {"per_core": None, "samples": 0, "label": "machine load not measured"}
    per_core = {"min": min(samples), "median": statistics.median(samples), "max": max(samples)}
    return {"per_core": per_core, "samples": len(samples), "label": load_label(per_core)}


def load_label(per_core: dict | None) -> str:
    """The words a results file uses for its machine's state, from the measured load (never a constant)."""
    if not per_core:
        return "machine load not measured"
    spread = f"load {per_core['median']:.2f} per core (median; {per_core['min']:.2f}–{per_core['max']:.2f})"
    quiet = per_core["median"] <= QUIET_PER_CORE and per_core["max"] <= 2 * QUIET_PER_CORE
    return f"quiet machine, {spread}" if quiet else f"shared machine, {spread}"
