"""The CPU tree shapes the app and bench.trees use are the ones bench/tree_size.py picked and committed: re-running
the sweep without updating decoders/drafters/tree_draft.py::CPU_SHAPES (or the reverse) fails here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoders.drafters.tree_draft import CPU_SHAPES

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
SWEEPS = {"EAGLE head": "tree-size-smollm2-135m.json", "draft model": "tree-size-qwen2.5-coder-1.5b.json"}


@pytest.mark.parametrize("grower", sorted(SWEEPS))
def test_the_shape_is_the_sweep_s_pick(grower):
    result = json.loads((RESULTS / SWEEPS[grower]).read_text(encoding="utf-8"))
    assert result["settings"]["grower"] == grower
    assert tuple(result["picked"]) == CPU_SHAPES[grower]
    picked = [m for m in result["measured"] if tuple(m["shape"]) == CPU_SHAPES[grower]]
    assert picked and picked[0]["identical"].split("/")[0] == picked[0]["identical"].split("/")[1]  # all lossless


def test_the_race_and_the_bench_run_those_shapes():
    from app.tabs.race import runs as race
    from bench.trees import methods_for

    for grower, name in (("draft model", race.EAGLE2_DRAFT), ("EAGLE head", race.EAGLE2_HEAD)):
        k, depth, m = CPU_SHAPES[grower]
        preset = race.PRESETS[name]
        assert (preset["tree_k"], preset["tree_depth"], preset["tree_m"]) == (k, depth, m)
        assert f"K{k} D{depth} M{m}" in name
        cpu = [x for x in methods_for(grown_by_head=grower == "EAGLE head") if x.key == "ours/eagle2-cpu"][0]
        assert (cpu.options["tree_k"], cpu.options["tree_depth"], cpu.options["tree_m"]) == (k, depth, m)
