"""Which Generate controls apply to the chosen method, and the values the page and its examples start from.

What applies to what is decoders.options' knowledge (fields_in_use, rules_for, initial_lam) plus the registry's
model families; this module only turns it into control states, so the page cannot reach a combination that
validation would reject: prompt lookup offers only the rules that can steer it, the draft-model drafter is offered
only for a target with a same-family draft, and controls that do not change the run are hidden. Pure data (no
gradio): layout.py turns the states into gr.update.
"""
from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

from decoders.options import DecodeOptions, fields_in_use, initial_lam, rules_for
from decoders import registry
from decoders.registry import Family, uses_draft_model

DEFAULT_DRAFT = "(registry pairing)"  # the draft-model dropdown's "use the registry's pairing" choice
# What a tree grows from (the eagle_head control): the draft model (eagle_head None) or the target's EAGLE head.
FROM_DRAFT, FROM_HEAD = "draft-model", "auto"
TREE_SOURCES = ((FROM_DRAFT, "the draft model"), (FROM_HEAD, "an EAGLE head (shipped or trained for the target)"))
# The recorded run the page opens on (assets/traces; its README says how it was made), and the controls' starting
# values: that run's own options, every one of them (length and precision included), so Run repeats it live.
OPENING_TRACE = "opening-suffix-type-hints.json"  # SmolLM2, suffix decoding, a code edit (bench/record_opening.py)
OPENING_BASELINE = "opening-baseline-type-hints.json"  # the baseline recorded beside it, in the same process
FALLBACK_OPENING = DecodeOptions(method="speculative", drafter="eagle2", eagle_head="auto")


def recorded_prompt(path: Path) -> str:
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["prompt"])
    except Exception:  # no such file: no recorded prompt to compare a run with
        return ""


def recorded_options(path: Path) -> DecodeOptions:
    """The DecodeOptions a recorded trace was made with (the fallback when the file is missing or unreadable)."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))["options"]
        known = {f.name for f in fields(DecodeOptions)}
        return replace(DecodeOptions.from_dict({k: v for k, v in stored.items() if k in known}), record=True,
                       device="auto").validate()
    except Exception:  # no such file, or options this version no longer accepts: open on the defaults' tree
        return FALLBACK_OPENING


OPENING_PATH = Path(__file__).resolve().parents[3] / "assets" / "traces" / OPENING_TRACE
OPENING = recorded_options(OPENING_PATH)
OPENING_PROMPT = recorded_prompt(OPENING_PATH)
# What a person notices when a live run does not repeat the recording: these settings, by their control labels.
COMPARED = {"model": "target model", "dtype": "number format", "method": "method", "drafter": "drafter",
            "draft_model": "draft model", "eagle_head": "tree source", "max_new_tokens": "max new tokens",
            "temperature": "temperature", "tree_k": "K", "tree_depth": "D", "tree_m": "M", "chat": "chat template"}


def opening_differences(options: dict, prompt: str) -> list[str] | None:
    """For a run of the opening recording's prompt: the settings that differ from the recording's, as
    "max new tokens 48 → 100" ([] = the same settings); None for another prompt (nothing to compare). Only the
    fields the live run's method reads are compared (a chain drafter reads no K or M), each said the way its control
    says it ("tree source the draft model → an EAGLE head", never "None → auto")."""
    if not OPENING_PROMPT or prompt != OPENING_PROMPT:
        return None
    recorded = OPENING.to_dict()
    try:
        read = DecodeOptions.from_dict({k: v for k, v in options.items() if k in _FIELDS}).fields_in_use()
    except Exception:  # options this version cannot read: compare what both name
        read = frozenset(COMPARED)
    return [f"{label} {_in_words(name, recorded.get(name))} → {_in_words(name, options.get(name))}"
            for name, label in COMPARED.items()
            if name in options and name in read and options.get(name) != recorded.get(name)]


_FIELDS = {f.name for f in fields(DecodeOptions)}


def _in_words(name: str, value) -> str:
    """A setting's value as its control shows it."""
    if name == "eagle_head":
        return dict(TREE_SOURCES)[FROM_DRAFT if value is None else FROM_HEAD].split(" (")[0]
    if name == "draft_model" and value is None:
        return "the registry's pairing"
    if name == "chat":
        return "on" if value else "off"
    if name == "dtype" and value == "auto":
        return "auto (float32)"
    return str(value)
RESTING_LAM_RULE = "adaedl"  # whose starting λ the (hidden) λ slider holds while the rule has no λ
# Controls whose choices, value or visibility follow the method; each sets the DecodeOptions field of its name.
TREE_CONTROLS = ("eagle_head", "tree_k", "tree_depth", "tree_m", "ddd_checks", "ddd_x", "ddd_steps", "ddd_width",
                 "suffix_depth", "suffix_tokens", "suffix_factor", "suffix_min_prob")
DEPENDENT = ("drafter", "draft_model", "rule", "controller", "gamma", "max_draft", "lam", "ngram", "skip_layers",
             "top_k", "top_p", "seed") + TREE_CONTROLS
# What an example sets (everything that shapes the run; length, dtype and display toggles stay the user's).
EXAMPLE_CONTROLS = ("prompt", "model", "method", "drafter", "draft_model", "rule", "controller", "gamma", "max_draft",
                    "lam", "ngram", "skip_layers", "temperature", "top_k", "top_p", "seed") + TREE_CONTROLS


def _registry() -> dict:
    try:
        from decoders.runtime.models import REGISTRY
    except ImportError:  # the registry module is missing: no pairing is known
        return {}
    return REGISTRY


def drafts_for(model: str, drafter: str | None = None) -> list[str]:
    """Registry models that can draft for this target, its pairing first: the same family (so the same tokenizer),
    or for a drafter whose draft has a tokenizer of its own, any other model where the registry pairs one.
    A target outside the registry (a hub id, a local folder) may pair with any of them: checked when it loads."""
    registry = _registry()
    entry = registry.get(model)
    if entry is None:
        return list(registry)
    if _own_tokenizer(drafter):
        others = [name for name in registry if name != model] if entry.cross_draft else []
        return sorted(others, key=lambda name: name != entry.cross_draft)
    family = [name for name, e in registry.items() if e.family == entry.family and name != model]
    return sorted(family, key=lambda name: name != entry.default_draft)


def draft_choices(model: str, drafter: str | None = None) -> list[str]:
    """The draft-model dropdown: "(registry pairing)" only where the registry pairs this target (for this drafter)."""
    entry = _registry().get(model)
    paired = entry is not None and (entry.cross_draft if _own_tokenizer(drafter) else entry.default_draft)
    return ([DEFAULT_DRAFT] if paired else []) + drafts_for(model, drafter)


def _own_tokenizer(drafter: str | None) -> bool:
    spec = registry.DRAFTERS.get(drafter) if drafter else None
    return spec is not None and spec.own_tokenizer


def has_head(model: str) -> bool:
    """Is an EAGLE head shipped (assets/eagle) or trained (the cache) for this target?"""
    try:
        from decoders.eagle.official import locate_head

        locate_head(model)
        return True
    except Exception:  # no head (EagleHeadError), or the EAGLE modules cannot load: offer no head
        return False


SELF_DRAFTERS = ("early-exit", "prophet")  # learned self-drafters: offered where trained weights exist


def has_self_weights(model: str, kind: str) -> bool:
    """Are early-exit / prophet weights shipped (assets/<kind>) or trained (the cache) for this target?"""
    try:
        from decoders.selfdraft.store import locate

        locate(kind, model)
        return True
    except Exception:  # none trained (WeightsMissing), or the modules cannot load: do not offer the drafter
        return False


def tree_sources(model: str) -> list[str]:
    """What a tree can grow from for this target: its same-family draft model and/or its EAGLE head."""
    return [source for source, available in ((FROM_DRAFT, bool(drafts_for(model))), (FROM_HEAD, has_head(model)))
            if available]


def grown(drafter: str) -> bool:
    """A tree grown by a model (the pair's draft or an EAGLE head: it reads eagle_head), not copied from text."""
    spec = registry.DRAFTERS.get(drafter)
    return spec is not None and "eagle_head" in spec.fields


def drafters_for(model: str) -> list[str]:
    """The drafter choices: the draft-model drafter only for a target that has a draft to pair with, the grown tree
    drafters only for one with a draft model or an EAGLE head to grow the tree (suffix decoding needs neither)."""
    chain = [d for d in registry.names(registry.DRAFTERS, Family.CHAIN)
             if (drafts_for(model, d) or not uses_draft_model(DecodeOptions(method="speculative", drafter=d)))
             and (d not in SELF_DRAFTERS or has_self_weights(model, d))]
    sources = tree_sources(model)
    return chain + [d for d in registry.names(registry.DRAFTERS, Family.TREE) if sources or not grown(d)]


def control_states(model: str, method: str, drafter: str, rule: str, temperature: float,
                   draft_model: str | None, eagle_head: str | None = None, controller: str = "off") -> dict[str, dict]:
    """{control: {"visible", and where they change: "choices", "value"}} for the DEPENDENT controls.

    A drafter, rule or tree source the new choices no longer offer moves to the first one offered (prompt lookup ->
    static; a target without a draft model grows its tree from its EAGLE head).
    """
    drafters = drafters_for(model)
    drafter = drafter if drafter in drafters else (OPENING.drafter if OPENING.drafter in drafters else drafters[0])
    rules = list(rules_for(drafter))
    rule = rule if rule in rules else rules[0]
    drafts = draft_choices(model, drafter)
    draft = draft_model if draft_model in drafts else (drafts[0] if drafts else None)
    sources = tree_sources(model)
    source = eagle_head if eagle_head in sources else (sources[0] if sources else None)  # none: nothing to pick
    used = fields_in_use(method, drafter, rule, _number(temperature), controller or "off")
    grows_from_head = grown(drafter) and source == FROM_HEAD
    states = {name: {"visible": name in used} for name in DEPENDENT}
    states["drafter"].update(choices=drafters, value=drafter, info=drafter_help(drafters))
    states["rule"].update(choices=rules, value=rule)
    states["draft_model"].update(choices=drafts, value=draft,
                                 visible="draft_model" in used and bool(drafts) and not grows_from_head)
    states["eagle_head"].update(choices=[(label, value) for value, label in TREE_SOURCES if value in sources],
                                value=source)
    return states


def drafter_help(drafters: list[str]) -> str:
    """The drafter radio's help: one line per drafter offered (the registry's own words), none for one this target
    does not offer (early exit and prophet only where their weights are trained for it)."""
    return ". ".join(f"{name}: {registry.DRAFTERS[name].help}" for name in drafters if name in registry.DRAFTERS)


def lam_for(rule: str) -> float | None:
    """The λ slider follows the rule: a rule's own starting λ (None: the rule has no λ, leave the slider)."""
    return initial_lam(rule)


def control_value(name: str, options: DecodeOptions):
    """The value a control shows for one DecodeOptions field."""
    value = getattr(options, name)
    if name in ("skip_layers", "ddd_checks"):
        return ",".join(str(i) for i in value) if value else ""
    if name == "eagle_head":  # the control says what the tree grows from; a folder or hub id is an API matter
        return FROM_DRAFT if value is None else FROM_HEAD
    if name == "draft_model":  # None: the pairing, where the registry has one for this target
        pairing = DEFAULT_DRAFT if DEFAULT_DRAFT in draft_choices(options.model, options.drafter) else None
        return value or pairing
    if name == "lam" and value is None:  # the rule's own default; a rule without λ leaves the slider at rest
        return initial_lam(options.rule) or initial_lam(RESTING_LAM_RULE)
    return value


def opening_value(name: str):
    return control_value(name, OPENING)


def example_options(example: dict) -> DecodeOptions:
    """An example's full settings: its suggestions (DecodeOptions fields) over the defaults' tree on SmolLM2 (not over
    the opening recording's, whose Qwen pair would make every example without a model of its own a slow one)."""
    return replace(FALLBACK_OPENING, **example.get("suggest", {}))


def example_row(example: dict) -> list:
    """The values gr.Examples sets, one per EXAMPLE_CONTROLS. The tree source is the one the example's target offers
    (a target without an EAGLE head grows trees from its draft model), so the page's filters keep every value."""
    options = example_options(example)
    values = {name: example["prompt"] if name == "prompt" else control_value(name, options) for name in EXAMPLE_CONTROLS}
    values["eagle_head"] = control_states(values["model"], values["method"], values["drafter"], values["rule"],
                                          values["temperature"], values["draft_model"], values["eagle_head"],
                                          values["controller"])["eagle_head"]["value"]
    return [values[name] for name in EXAMPLE_CONTROLS]


def example_states(example: dict) -> dict[str, dict]:
    """{control: {"value", and for dependent controls "choices"/"visible"}} for every EXAMPLE_CONTROLS entry.

    Values and choices travel together: an example that switches to the draft-model drafter also brings the
    choices that contain it (Gradio rejects a value outside a control's current choices)."""
    values = dict(zip(EXAMPLE_CONTROLS, example_row(example)))
    states = control_states(values["model"], values["method"], values["drafter"], values["rule"],
                            values["temperature"], values["draft_model"], values["eagle_head"], values["controller"])
    return {name: {**states.get(name, {}), "value": values[name]} for name in EXAMPLE_CONTROLS}


def _number(value) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def dtype_choices(model: str) -> list[tuple[str, str]]:
    """The number formats, each labelled with what it promises; bfloat16 with its speed here once measured."""
    from decoders.runtime.dtype_choice import ROUNDING_NOTE

    return [("auto (float32: exact)", "auto"), ("float32", "float32"),
            (f"bfloat16 ({format_speed_note(model, 'bfloat16')}{ROUNDING_NOTE})", "bfloat16")]


def format_speed_note(model: str, dtype: str) -> str:
    """"1.3x float32's one-token speed here; " from this machine's measured cost curves, or "" when not measured."""
    try:
        from decoders.costs import format_speedup

        ratio = format_speedup(model, dtype)
    except Exception:  # no measurement module or cache: say nothing rather than guess
        return ""
    return f"measured {ratio:.2f}x float32's one-token speed here; " if ratio else ""
