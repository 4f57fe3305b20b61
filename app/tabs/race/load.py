"""How busy the machine was while the Race timed a method: measured, so a sentence calls it "busy" only from a number.

Two measures, taken right before a method's first timed run and right after its last:
- the load average per core (os.getloadavg: runnable threads, averaged over a minute), before and after; the race's
  own threads count in it, so after a timed run it reads high even on a quiet machine;
- the cores other processes kept busy meanwhile: the whole machine's busy CPU time (/proc/stat, steal included: a
  virtual machine's host took it) minus this process's own (os.times), over the wall time. This one leaves the race
  itself out, so it is what decides "busy" (where /proc/stat is missing, the load average before the runs does).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait in /proc/stat's cpu line (user nice system idle iowait irq softirq steal ...)
BUSY_SHARE = 0.25  # other processes using a quarter of the cores or more, on average, slow the race's threads down
BUSY_LOAD = 1.0  # without /proc/stat: more runnable threads than cores before the timed runs


@dataclass(frozen=True)
class Snapshot:
    wall: float  # time.monotonic()
    load: float | None  # 1-minute load average per core
    busy: float | None  # the machine's busy CPU seconds so far, every core (None without /proc/stat)
    own: float  # this process's CPU seconds so far (user + system, every thread)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def snapshot() -> Snapshot:
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # not measurable on this platform
        load = None
    times = os.times()
    return Snapshot(time.monotonic(), load, _busy_seconds(), times.user + times.system)


def _busy_seconds() -> float | None:
    try:
        fields = [int(v) for v in PROC_STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = sum(fields[:8])  # guest time is already inside user and nice
    return (total - sum(fields[i] for i in IDLE_FIELDS)) / ticks


def between(before: Snapshot, after: Snapshot) -> dict:
    """The load record of one method's timed runs (what the trace keeps in totals["race_load"])."""
    seconds = after.wall - before.wall
    others = None
    if before.busy is not None and after.busy is not None and seconds > 0:
        others = max(0.0, (after.busy - before.busy) - (after.own - before.own)) / seconds
    return {"cores": cores(), "seconds": seconds, "load_per_core_before": before.load,
            "load_per_core_after": after.load, "others_cores": others}


def is_busy(load: dict | None) -> bool | None:
    """Whether other work competed with the timed runs (None: nothing measured)."""
    if not load:
        return None
    if load.get("others_cores") is not None:
        return load["others_cores"] >= BUSY_SHARE * (load.get("cores") or 1)
    if load.get("load_per_core_before") is not None:
        return load["load_per_core_before"] > BUSY_LOAD
    return None


def load_words(load: dict | None) -> str:
    """The measurement in words: "other processes used 1.3 of 2 cores; load average 2.1 → 3.0 per core"."""
    if not load:
        return ""
    parts = []
    if load.get("others_cores") is not None:
        parts.append(f"other processes used {load['others_cores']:.1f} of {load.get('cores', '?')} cores")
    before, after = load.get("load_per_core_before"), load.get("load_per_core_after")
    if before is not None and after is not None:
        parts.append(f"load average {before:.1f} → {after:.1f} per core")
    return "; ".join(parts)
