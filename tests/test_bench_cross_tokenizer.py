"""bench/cross_tokenizer.py on toy models with two tokenizers: every arm runs (SpecLab's and transformers' universal
assisted generation), outputs are compared with the baseline, and the table and the verdict read (the real pair's
numbers come from the official run: python -m bench.cross_tokenizer)."""
from __future__ import annotations

import pytest

from bench import cross_tokenizer
from bench.runner import Prompt
from decoders import retokenize

from tiny_tokenizers import TOY_PROBES, toy_models

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_every_arm_runs_and_the_table_reads(monkeypatch):
    monkeypatch.setattr(retokenize, "PROBES", TOY_PROBES)
    toys = toy_models()
    models = {"target": toys["target"], "draft": toys["other"]}  # other merges, one more token: UAG's case
    arms = cross_tokenizer.methods()
    assert {a.key for a in arms} >= {"ours/baseline", cross_tokenizer.HEADLINE, "hf/greedy", "hf/uag", "hf/uag-5"}
    prompts = [Prompt("a", "chat", "", toys["target"].encode_prompt("ab cab a")),
               Prompt("b", "code-writing", "", toys["target"].encode_prompt("cc ab ba"))]
    records = cross_tokenizer.run_all(arms, models, prompts, reps=1, max_new_tokens=12, log=lambda *a: None,
                                      warmup=False)
    assert len(records) == len(arms) * len(prompts)
    ours = [r for r in records if r["family"] == "ours"]
    assert all(r["identical_to_baseline"] for r in ours)  # greedy: SpecLab's arms equal its baseline
    uag = [r for r in records if r["method"] == "hf/uag"]
    assert all(r["n_tokens"] == 12 and r["target_forwards"] >= 1 for r in uag)
    table = cross_tokenizer.rows(records, arms)
    headline = next(r for r in table if r["method"] == cross_tokenizer.HEADLINE and r["kind"] == "all")
    assert headline["speedup"] is not None and headline["vs_hf/uag"] is not None
    text = cross_tokenizer.markdown({"settings": {"target": "toy", "draft": "other", "draft_precision": "float32",
                                                  "machine": "test", "command": "x", "prompts": 2, "reps": 1,
                                                  "max_new_tokens": 12, "threads": 1, "minutes": 0.0, "load": "-"},
                                     "rows": table})
    assert "| SpecLab cross-tokenizer · AdaEDL · cost-aware cap | all |" in text and "target ≥ 1.1×" in text


def test_the_verdict_takes_the_faster_uag_arm():
    row = {"method": cross_tokenizer.HEADLINE, "kind": "all", "label": "x", "vs_hf/uag": 1.5, "vs_hf/uag-5": 1.05,
           "identical": "6/6"}
    assert "1.05×" in cross_tokenizer.verdict([row]) and "not met" in cross_tokenizer.verdict([row])
    row["vs_hf/uag-5"] = 1.2
    assert "1.20×" in cross_tokenizer.verdict([row]) and ": met" in cross_tokenizer.verdict([row])
    row["identical"] = "5/6"
    assert "baseline: no" in cross_tokenizer.verdict([row])
