"""The Generate controls cannot reach a combination validation rejects; examples and defaults have one source."""
from __future__ import annotations

import itertools

import pytest

from app.tabs.generate import handlers

from app.tabs.race import runs as race
from app.tabs.generate import controls
from app.tabs.generate.controls import (DEFAULT_DRAFT, DEPENDENT, EXAMPLE_CONTROLS, FROM_DRAFT, FROM_HEAD, OPENING, RESTING_LAM_RULE,
                          control_states, example_row, example_states, lam_for, opening_value)
from app.tabs.generate.layout import example_prompts
from decoders.api import draft_for
from decoders.runtime.models import REGISTRY
from decoders.options import DRAFTERS, METHODS, RULES, TREE_DRAFTERS, DecodeOptions, OptionsError, fields_in_use
from decoders.registry import build_rule

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def opening_controls(**overrides) -> dict:
    """The page's starting control values (what the Generate tab shows before anyone touches it)."""
    values = {name: opening_value(name) for name in handlers.RUN_INPUTS if name not in ("prompt", "live")}
    values.update(prompt="hello", live=True, **overrides)
    return values


def after_adjusting(values: dict, previous_rule: str | None = None) -> dict:
    """What the page holds once the dependent controls have followed a choice (ui._wire_dependent_controls):
    choices filtered, and the λ slider on the rule's own λ whenever the rule changed."""
    states = control_states(values["model"], values["method"], values["drafter"], values["rule"],
                            values["temperature"], values["draft_model"], values.get("eagle_head"))
    adjusted = dict(values)
    for name in DEPENDENT:
        if "value" in states[name]:
            adjusted[name] = states[name]["value"]
    if lam_for(adjusted["rule"]) is not None and adjusted["rule"] != (previous_rule or values["rule"]):
        adjusted["lam"] = lam_for(adjusted["rule"])
    return adjusted


@pytest.mark.parametrize("model, method, drafter, rule, temperature",
                         itertools.product(list(REGISTRY), METHODS, DRAFTERS, RULES, (0.0, 0.8)))
def test_every_choice_reachable_in_the_ui_builds_valid_options(model, method, drafter, rule, temperature):
    values = after_adjusting(opening_controls(model=model, method=method, drafter=drafter, rule=rule,
                                              temperature=temperature, draft_model=DEFAULT_DRAFT))
    options = handlers.options_from(values)  # raises OptionsError on an impossible combination
    draft_for(options)  # and a draft-model run has a draft to load


def test_prompt_lookup_moves_the_rule_to_one_it_offers():
    states = control_states("smollm2-135m", "speculative", "prompt-lookup", "adaedl", 0.0, None)
    assert states["rule"]["choices"] == ["static", "heuristic"] and states["rule"]["value"] == "static"
    assert states["ngram"]["visible"] and not states["lam"]["visible"] and not states["skip_layers"]["visible"]


def test_the_draft_model_drafter_is_offered_only_with_a_same_family_draft():
    single = control_states("smollm2-135m", "speculative", "draft-model", "adaedl", 0.0, None)
    assert "draft-model" not in single["drafter"]["choices"] and single["drafter"]["value"] != "draft-model"
    paired = control_states("qwen2.5-coder-1.5b", "speculative", "draft-model", "adaedl", 0.0, "smollm2-135m")
    assert paired["drafter"]["value"] == "draft-model" and paired["draft_model"]["visible"]
    assert paired["draft_model"]["choices"] == [DEFAULT_DRAFT, "qwen2.5-coder-0.5b"]
    assert paired["draft_model"]["value"] == DEFAULT_DRAFT  # SmolLM2 cannot draft for Qwen: not kept


@pytest.mark.parametrize("method, drafter, rule, temperature", itertools.product(METHODS, DRAFTERS, RULES, (0.0, 1.0)))
def test_visible_controls_are_the_fields_in_use(method, drafter, rule, temperature):
    states = control_states("qwen2.5-coder-1.5b", method, drafter, rule, temperature, DEFAULT_DRAFT)
    used = fields_in_use(method, states["drafter"]["value"], states["rule"]["value"], temperature)
    assert {name for name in DEPENDENT if states[name]["visible"]} == {name for name in DEPENDENT if name in used}


def test_greedy_hides_the_sampling_controls():
    greedy = control_states("smollm2-135m", "baseline", "layer-skip", "static", 0.0, None)
    sampled = control_states("smollm2-135m", "baseline", "layer-skip", "static", 0.7, None)
    assert not any(greedy[n]["visible"] for n in ("top_k", "top_p", "seed"))
    assert all(sampled[n]["visible"] for n in ("top_k", "top_p", "seed"))


@pytest.mark.parametrize("example", example_prompts(), ids=lambda e: e["title"])
def test_each_example_sets_a_valid_consistent_run(example):
    values = opening_controls(model="gemma3-270m", draft_model=None, rule="heuristic")  # whatever was there before
    values.update(zip(EXAMPLE_CONTROLS, example_row(example)))
    assert after_adjusting(values) == values  # the page's filters leave the example's settings as they are
    options = handlers.options_from(values)
    draft_for(options)
    for field, value in example.get("suggest", {}).items():
        assert getattr(options, field) == value


def test_the_code_writing_example_targets_a_model_with_a_draft():
    example = next(e for e in example_prompts() if e["kind"] == "code writing")
    values = dict(zip(EXAMPLE_CONTROLS, example_row(example)))
    assert values["drafter"] == "draft-model" and REGISTRY[values["model"]].default_draft


@pytest.mark.parametrize("example", example_prompts(), ids=lambda e: e["title"])
def test_an_example_click_brings_choices_that_admit_its_values(example):
    """Gradio rejects a value outside a control's current choices: the click sends both together."""
    states = example_states(example)
    assert set(states) == set(EXAMPLE_CONTROLS)
    assert [states[n]["value"] for n in EXAMPLE_CONTROLS] == example_row(example)
    for name in ("drafter", "rule", "draft_model"):
        if states[name].get("visible", True) and states[name]["value"] is not None:
            assert states[name]["value"] in states[name]["choices"], name


def test_max_confidence_starts_from_the_same_lambda_in_generate_and_race():
    """Before, the λ slider always sent 0.5, so max-confidence began at 0.5 in Generate and 0.4 in the Race."""
    picked = after_adjusting(opening_controls(model="qwen2.5-coder-1.5b", drafter="draft-model",
                                              rule="max-confidence", controller="off"),
                             previous_rule=OPENING.rule)
    generate = handlers.options_from(picked)
    raced = race.race_options({"model": "qwen2.5-coder-1.5b", "methods": ["draft model · max-confidence"]})[1]

    def start(o: DecodeOptions) -> float:
        return build_rule(o).schedule.lam

    assert start(generate) == start(raced) == 0.4


def test_opening_values_are_the_opening_recordings_own():
    """Issue 24: Run on the opening page decoded another length and precision than the recording it showed, so the
    text parted from the recording after ~25 tokens. Every control now starts on the recording's own options."""
    from app.tabs.generate.controls import OPENING_TRACE, recorded_options
    from app.tabs.generate.views import read_trace_file
    from app.tabs.generate.layout import ASSETS

    stored = read_trace_file(ASSETS / "traces" / OPENING_TRACE).options
    for field in ("model", "method", "drafter", "gamma", "max_draft", "ngram", "max_new_tokens", "temperature", "top_k",
                  "top_p", "seed", "dtype", "chat", "tree_k", "tree_depth", "tree_m"):
        assert getattr(OPENING, field) == stored[field], field
    assert opening_value("max_new_tokens") == stored["max_new_tokens"] and opening_value("dtype") == stored["dtype"]
    assert opening_value("lam") == (lam_for(OPENING.rule) or lam_for(RESTING_LAM_RULE))
    assert recorded_options(ASSETS / "traces" / "no-such-file.json").method == "speculative"  # the fallback


def test_the_page_opens_with_the_settings_and_prompt_of_the_run_it_shows():
    """Before, the page showed a recorded prompt-lookup run while its controls and prompt said layer skip + AdaEDL
    on another prompt, so the first Run decoded the slow case issue 10 #10 reports."""
    from app.tabs.generate.layout import ASSETS, _opening_prompt
    from app.tabs.generate.views import opening_trace, read_trace_file, recorded_traces

    recorded = recorded_traces(ASSETS / "traces")
    trace = read_trace_file(recorded[opening_trace(recorded)])
    fields = ("method", "drafter", "eagle_head", "tree_k", "tree_depth", "tree_m", "rule", "gamma")
    assert {f: getattr(OPENING, f) for f in fields} == {f: trace.options[f] for f in fields}
    assert _opening_prompt(trace) == trace.prompt


def test_the_page_shows_the_opening_values():
    from app.page import build_demo

    config = build_demo().get_config_file()
    by_label = {c["props"].get("label"): c["props"] for c in config["components"] if "props" in c}
    assert by_label["max new tokens"]["value"] == OPENING.max_new_tokens
    assert by_label["initial λ"]["value"] == lam_for(RESTING_LAM_RULE)
    assert by_label["initial λ"]["visible"] is False  # a tree has no draft-length rule, so no λ ...
    assert by_label["γ (draft length)"]["visible"] is False  # ... and no γ: its shape bounds its depth
    # the opening's own tree controls are shown, the others hidden
    tree_k = "tree_k" in fields_in_use(OPENING.method, OPENING.drafter, OPENING.rule, OPENING.temperature)
    assert by_label["K (children per expanded node)"]["visible"] is tree_k
    # Built with every drafter and rule (an API call is checked against the built choices and must reach the
    # options' own fix-it messages); the page narrows them on load to what the opening target can run.
    assert [c[0] for c in by_label["Drafter"]["choices"]] == list(DRAFTERS + TREE_DRAFTERS)
    assert [c[0] for c in by_label["Draft-length rule"]["choices"]] == list(RULES)
    narrowed = control_states(OPENING.model, OPENING.method, OPENING.drafter, OPENING.rule, OPENING.temperature, None)
    paired = bool(controls.drafts_for(OPENING.model))  # a same-family draft model (the Qwen pair): its drafter too
    trees = [d for d in TREE_DRAFTERS if paired or controls.has_head(OPENING.model) or not controls.grown(d)]
    learned = [d for d in controls.SELF_DRAFTERS if controls.has_self_weights(OPENING.model, d)]  # shipped weights
    chain = (["draft-model"] if paired else []) + ["prompt-lookup", "layer-skip"]
    crossed = ["cross-tokenizer"] if controls.drafts_for(OPENING.model, "cross-tokenizer") else []  # its own pairing
    assert narrowed["drafter"]["choices"] == chain + learned + crossed + trees and OPENING.drafter in trees
    loads = [d for d in config["dependencies"] if any(t[1] == "load" for t in d.get("targets", []))]
    assert loads, "no page-load event narrows the dependent controls"


def test_only_a_visitors_own_edits_readjust_the_dependent_controls():
    """An example sets model, drafter and rule in one update; `.change` handlers fired once per control, some with
    the others' old values, and a late reply put the drafter back to prompt lookup (CI, stop 15)."""
    from app.page import build_demo

    config = build_demo().get_config_file()
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    deciders = {ids["sl-model"], ids["sl-drafter"], ids["sl-rule"]}
    readjusting = [d for d in config["dependencies"] if ids["sl-drafter"] in d["outputs"]
                   and any(target in deciders for target, _ in d["targets"])]
    assert readjusting  # the wiring is still there ...
    assert {event for d in readjusting for target, event in d["targets"] if target in deciders} == {"input"}  # ... on input


@pytest.fixture
def heads(monkeypatch):
    """Pretend these targets have an EAGLE head (shipped or trained): which ones, set by the test."""
    have: set[str] = set()
    monkeypatch.setattr(controls, "has_head", lambda model: model in have)
    return have


def test_tree_drafters_are_offered_where_something_can_grow_the_tree(heads):
    offered = control_states("smollm2-135m", "speculative", "eagle2", "static", 0.0, None)["drafter"]["choices"]
    assert set(TREE_DRAFTERS) & set(offered) == {"suffix"}  # suffix decoding copies text: it needs no model
    paired = control_states("qwen2.5-coder-1.5b", "speculative", "eagle2", "static", 0.0, DEFAULT_DRAFT)
    assert paired["drafter"]["value"] == "eagle2" and paired["eagle_head"]["value"] == FROM_DRAFT
    assert paired["draft_model"]["visible"] and paired["tree_depth"]["visible"] and not paired["ddd_x"]["visible"]
    heads.add("smollm2-135m")
    single = control_states("smollm2-135m", "speculative", "ddd", "static", 0.0, None, FROM_DRAFT)
    assert single["drafter"]["value"] == "ddd" and single["eagle_head"]["value"] == FROM_HEAD  # no draft: the head
    assert [value for _, value in single["eagle_head"]["choices"]] == [FROM_HEAD]
    assert not single["draft_model"]["visible"] and single["ddd_x"]["visible"] and not single["tree_depth"]["visible"]
    assert not single["rule"]["visible"] and not single["gamma"]["visible"]  # a tree's shape bounds its depth


@pytest.mark.parametrize("model, drafter, source, temperature",
                         itertools.product(list(REGISTRY), TREE_DRAFTERS, (FROM_DRAFT, FROM_HEAD), (0.0, 0.8)))
def test_every_tree_choice_reachable_in_the_ui_builds_valid_options(heads, model, drafter, source, temperature):
    heads.update({"smollm2-135m", "qwen2.5-coder-1.5b"})
    values = after_adjusting(opening_controls(model=model, method="speculative", drafter=drafter, eagle_head=source,
                                              temperature=temperature, draft_model=DEFAULT_DRAFT))
    options = handlers.options_from(values)
    if controls.grown(options.drafter):
        assert (options.eagle_head == "auto") == (values["eagle_head"] == FROM_HEAD)
        assert options.eagle_head is None or options.draft_model is None  # the head replaces the draft model
    draft_for(options)


def test_tree_controls_map_onto_the_papers_options():
    values = opening_controls(model="qwen2.5-coder-1.5b", method="speculative", drafter="ddd", eagle_head=FROM_HEAD,
                              draft_model="qwen2.5-coder-0.5b", ddd_checks=" 4, 6 ", ddd_x=-0.5, tree_m=40)
    options = handlers.options_from(values)
    assert (options.eagle_head, options.draft_model, options.ddd_checks, options.ddd_x, options.tree_m) == \
        ("auto", None, (4, 6), -0.5, 40)
    with pytest.raises(OptionsError, match="5,7,9"):
        handlers.options_from({**values, "ddd_checks": "five"})
    with pytest.raises(OptionsError, match="ddd_x"):
        handlers.options_from({**values, "ddd_x": 0.5})
    # The opening recording's K, D, M (a CPU-sized tree on the Qwen pair); DDD's x, n, w, S as the paper sets them.
    assert [opening_value(n) for n in ("tree_k", "tree_depth", "tree_m")] == [OPENING.tree_k, OPENING.tree_depth,
                                                                              OPENING.tree_m]
    assert [opening_value(n) for n in ("ddd_x", "ddd_steps", "ddd_width")] == [-0.3, 11, 10]
    assert opening_value("ddd_checks") == "5,7,9"
    assert opening_value("eagle_head") == (FROM_HEAD if OPENING.eagle_head else FROM_DRAFT)


def test_the_opening_status_says_what_is_shown_and_what_run_does():
    from app.tabs.generate.controls import OPENING_TRACE
    from app.tabs.generate.layout import ASSETS, opening_status
    from app.tabs.generate.views import read_trace_file

    trace = read_trace_file(ASSETS / "traces" / OPENING_TRACE)
    status = opening_status(trace)
    assert trace.options["model"] in status and trace.options["dtype"] in status
    assert f"{trace.options['max_new_tokens']} new tokens" in status and "**Run** repeats it live" in status
    assert len(status) <= 90  # two lines at 420 px: the result must follow Run closely (test_browser.py)


def test_the_opening_line_shows_the_baseline_recorded_beside_it():
    """Issue 35.5: the first page showed the opening run's speed with no baseline, so "faster" was never seen. The
    baseline is recorded with it (bench/record_opening.py: same model, prompt, budget, machine, one process)."""
    import re

    from app.tabs.generate.controls import OPENING_BASELINE, OPENING_TRACE
    from app.tabs.generate.layout import ASSETS, opening_status
    from app.tabs.generate.views import read_trace_file
    from app.tabs.race.load import is_busy

    trace = read_trace_file(ASSETS / "traces" / OPENING_TRACE)
    baseline = read_trace_file(ASSETS / "traces" / OPENING_BASELINE)
    assert baseline.method == "baseline" and baseline.prompt == trace.prompt
    for name in ("model", "dtype", "max_new_tokens", "temperature", "chat"):
        assert baseline.options[name] == trace.options[name], name
    machine = trace.totals["recorded"]["machine"]
    assert baseline.totals["recorded"]["machine"] == machine  # one machine recorded both
    fast, slow = trace.totals["tokens_per_second"], baseline.totals["tokens_per_second"]
    status = opening_status(trace, baseline)
    assert f"{fast:.2f} tokens/s, {fast / slow:.2f}× the baseline's {slow:.2f}" in status
    assert ", ".join(machine.split(", ")[:2]) in status and "**Run** repeats it live" in status
    shown = re.sub(r"<[^>]+>|\*\*", "", status)  # the visible text (a "busy" mark carries its measurement as a hover)
    assert len(shown) <= 210  # about four lines at 420 px (test_browser.py: the result follows Run closely)
    seconds = trace.totals["seconds"]  # issue 47.1: the line says where the time went, from the recording
    verify = seconds["verify"] / sum(seconds.values())
    assert f"τ {trace.totals['tau']:.1f}, {verify:.0%} verifying" in shown and "verification forwards" in status
    loads = [t.totals["recorded"]["load"] for t in (trace, baseline)]
    assert ("busy" in shown) == any(is_busy(load) for load in loads)  # said only from the measured load
    other = read_trace_file(ASSETS / "traces" / OPENING_TRACE)
    other.totals = {**other.totals, "recorded": {"machine": "another CPU, 8 cores"}}
    assert " on " not in opening_status(other, baseline).split("**")[0]  # no machine claimed when they differ


def test_a_run_of_the_opening_prompt_says_whether_it_repeated_the_recording():
    from dataclasses import replace

    from app.tabs.generate.controls import OPENING_PROMPT, opening_differences

    assert OPENING_PROMPT
    assert opening_differences(OPENING.to_dict(), OPENING_PROMPT) == []
    longer = replace(OPENING, max_new_tokens=OPENING.max_new_tokens + 52, dtype="bfloat16").to_dict()
    assert opening_differences(longer, OPENING_PROMPT) == [
        "number format float32 → bfloat16", f"max new tokens {OPENING.max_new_tokens} → {OPENING.max_new_tokens + 52}"]
    assert opening_differences(longer, "another prompt") is None


def test_the_differences_from_the_recording_name_only_what_the_method_reads_in_the_controls_words(monkeypatch):
    """Issue 47.7: a chain drafter's run listed K and M, which it never reads, and "tree source None → auto"."""
    from dataclasses import replace

    from app.tabs.generate.controls import OPENING_PROMPT, opening_differences

    chain = replace(OPENING, method="speculative", drafter="prompt-lookup", tree_k=OPENING.tree_k + 1,
                    tree_m=OPENING.tree_m + 1, eagle_head="auto").to_dict()
    said = opening_differences(chain, OPENING_PROMPT)
    assert not any(line.startswith(("K ", "M ", "D ", "tree source")) for line in said), said
    assert any(line.startswith("drafter ") for line in said) or OPENING.drafter == "prompt-lookup", said
    moved = replace(OPENING, method="speculative", drafter="eagle2", eagle_head="auto", tree_m=OPENING.tree_m + 2)
    import app.tabs.generate.controls as controls

    monkeypatch.setattr(controls, "OPENING", replace(OPENING, drafter="eagle2", eagle_head=None))
    said = opening_differences(moved.to_dict(), OPENING_PROMPT)
    assert "tree source the draft model → an EAGLE head" in said
    assert f"M {OPENING.tree_m} → {OPENING.tree_m + 2}" in said
    assert not any("None" in line or "auto" in line for line in said), said


def test_the_finished_status_names_what_differed(monkeypatch):
    from dataclasses import replace

    from app.tabs.generate.controls import OPENING_TRACE
    from app.tabs.generate.layout import ASSETS
    from app.tabs.generate.views import read_trace_file

    trace = read_trace_file(ASSETS / "traces" / OPENING_TRACE)
    assert "the same settings as the recording" in handlers._status(trace)
    trace.options = replace(OPENING, max_new_tokens=100).to_dict()
    assert f"differs from the recording the page opened on: max new tokens {OPENING.max_new_tokens} → 100" in \
        handlers._status(trace)
