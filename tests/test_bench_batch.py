"""bench/batch.py on tiny models: the figures it reports are computed from real runs and can fail."""
from __future__ import annotations

from dataclasses import replace

from bench import batch as bench_batch


def _prompts(n):
    return [{"id": f"p{i}", "ids": [(7 * i + k) % 64 for k in range(3 + 9 * i)]} for i in range(n)]


def test_rows_equal_alone_and_peers_are_recorded(tiny, drafts):
    models = {"target": tiny, "draft": drafts["noisy"]}
    methods = bench_batch.methods_for(has_draft=True)
    alone, rows = {}, []
    for b in (1, 3):
        for key, options in methods.items():
            result = bench_batch.run_ours(replace(options, max_new_tokens=10), _prompts(b), models, alone)
            rows.append({"set": "t", "batch": b, "method": key, **result})
            assert result["equivalence"]["mismatch"] == 0 and result["equivalence"]["prefix"] == 0
            assert sum(result["equivalence"].values()) == b and result["tokens"] == 10 * b
            assert 0 <= result["realign_share"] < 1
    bench_batch.summarize(rows)
    assert all(r["over_batched_baseline"] == 1.0 for r in rows if r["method"] == "baseline")
    hf = bench_batch.run_hf_batched(tiny, _prompts(3), 10, alone)
    assert hf["rows"] == 3 and hf["tokens"] == 30
    assert bench_batch.try_hf_assisted(tiny, drafts["noisy"], _prompts(2), 10).startswith("refused")
    grid = bench_batch.t_grid(tiny, context=8, batches=(1, 2), reps=1)
    assert [(g["batch"], g["n"]) for g in grid] == [(1, 1), (1, 5), (2, 1), (2, 5)]
    result = {"settings": {"target": "tiny", "draft": "noisy", "dtype": "float32", "max_new_tokens": 10, "threads": 1,
                           "machine": "test", "command": "python -m bench.batch", "minutes": 0.1},
              "rows": rows, "peers": [{"set": "t", "batch": 3, "method": "hf", **hf}], "hf_assisted": {"2": "refused"},
              "t_grid": grid}
    text = bench_batch.markdown(result)
    assert "| t | 3 | draft-model |" in text and "B=2: refused" in text
