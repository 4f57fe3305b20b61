"""The trace: invariants a renderer relies on, JSON round trip, schema validation, recording on/off."""
from __future__ import annotations

import json

import pytest

from decoders import DecodeOptions, Trace, TraceError, generate

OPTIONS = [
    DecodeOptions(max_new_tokens=20),
    DecodeOptions(method="speculative", rule="adaedl", max_new_tokens=30),
    DecodeOptions(method="speculative", rule="heuristic", max_new_tokens=30, temperature=1.0, seed=4),
    DecodeOptions(method="speculative", drafter="prompt-lookup", max_new_tokens=30),
    DecodeOptions(method="speculative", drafter="layer-skip", rule="max-confidence", max_new_tokens=30),
]
PROMPT = [10, 11, 12, 10, 11, 12, 10, 11]


@pytest.fixture(scope="module")
def traces(tiny, drafts):
    return [generate(o, PROMPT, target=tiny, draft=drafts["noisy"]) for o in OPTIONS]


def test_committed_tokens_concatenate_to_the_output(traces):
    for trace in traces:
        assert [t for r in trace.rounds for t in r.committed] == trace.output_ids
        assert [t.id for t in trace.tokens] == trace.output_ids
        assert "".join(t.text for t in trace.tokens) == trace.output_text
        assert [t.provenance for t in trace.tokens] == [p for r in trace.rounds for p in r.provenance]


def test_round_invariants(traces):
    for trace in traces:
        for rnd in trace.rounds:
            assert rnd.n_accepted <= rnd.n_drafted
            assert len(rnd.nodes) == rnd.n_drafted + 1 and rnd.nodes[0].status == "root"
            assert sum(n.status == "accepted" for n in rnd.nodes) == rnd.n_accepted
            if rnd.n_drafted:
                assert rnd.provenance[-1] in ("bonus", "resampled")
            else:
                assert rnd.provenance == ["baseline"]


def test_totals(traces):
    for trace in traces:
        totals = trace.totals
        assert totals["tokens"] == len(trace.output_ids)
        assert totals["target_forwards"] == len(trace.rounds)
        assert totals["tau"] == pytest.approx(len(trace.output_ids) / totals["target_forwards"])
        assert totals["accepted"] <= totals["drafted"]
        if totals["drafted"]:
            assert totals["acceptance_rate"] == pytest.approx(totals["accepted"] / totals["drafted"])
        assert all(0.0 <= a <= 1.0 for a in totals["per_position_acceptance"])
        assert sum(totals["accepted_histogram"]) == sum(1 for r in trace.rounds if r.n_drafted)


def test_baseline_trace_says_every_token_is_baseline(traces):
    base = traces[0]
    assert base.method == "baseline" and base.totals["tau"] == 1.0
    assert {t.provenance for t in base.tokens} == {"baseline"}


def test_rule_internals_are_recorded(traces):
    adaedl = traces[1]
    for rnd in adaedl.rounds:
        rule = rnd.rule
        assert rule["name"] == "adaedl" and "lam" in rule and "ar" in rule
        assert all({"entropy", "bound", "lam", "stop"} <= set(c) for c in rule["checks"])
        if rule["reason"] == "rule":
            assert rule["checks"][-1]["stop"] is True


def test_json_round_trip(traces):
    for trace in traces:
        text = trace.to_json()
        again = Trace.from_json(text)
        assert again == trace
        assert json.loads(again.to_json()) == json.loads(text)


def test_recording_off_gives_identical_tokens(tiny, drafts):
    for options in OPTIONS:
        on = generate(options, PROMPT, target=tiny, draft=drafts["noisy"])
        off = generate(DecodeOptions(**{**options.__dict__, "record": False}), PROMPT, target=tiny,
                       draft=drafts["noisy"])
        assert off.output_ids == on.output_ids and off.output_text == on.output_text
        assert all(not r.nodes for r in off.rounds)
        assert off.totals["tau"] == on.totals["tau"]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(schema_version=99), "schema version"),
    (lambda d: d.pop("rounds") and d.pop("prompt"), "missing field"),
    (lambda d: d["tokens"][0].update(provenance="magic"), "provenance"),
    (lambda d: d["rounds"][0].update(n_accepted=99), "accepted"),
    (lambda d: d.update(rounds="nope"), "must be a list"),
])
def test_bad_traces_are_rejected_with_a_message(traces, mutate, message):
    data = json.loads(traces[1].to_json())
    mutate(data)
    with pytest.raises(TraceError, match=message):
        Trace.from_dict(data)


def test_not_json_is_rejected():
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.from_json("{nope")
    with pytest.raises(TraceError, match="JSON object"):
        Trace.from_json("[1, 2]")
