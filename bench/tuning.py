"""Every side gets its best setting, chosen on TUNING prompts that are never scored.

A tunable method (a "group": HF assisted, SpecLab's draft model, both prompt lookups, AdaEDL at T=1) has a small
grid of settings. Each setting runs on the tuning prompts (assets/bench/*.json "tuning"), interleaved with the
SpecLab baseline; its score is the median over tuning prompts of the per-prompt median paired ratio tok/s(setting)
÷ tok/s(baseline, same prompt and repetition), so machine drift between settings cancels. The highest score wins
(ties: the earlier grid entry). The scored run then uses the winner; the whole grid goes into the result file.

Both prompt lookups use the same n-gram size (--pl-ngram; they match n..1, first occurrence from the left) and are
tuned only in how many tokens they copy. HF assisted is tuned on SpecLab's packed kernels, the headline's terms;
its stock-kernel twin ("as users run HF") reuses the chosen setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .common import CODE_KINDS, Prompt
from .report import ratio_over
from .runner import Method, hf, ours, run_suite

ASSISTED_TOKENS = (5, 10, 20)
ASSISTED_THRESHOLDS = (0.2, 0.4, 0.6)
ASSISTED_SCHEDULES = ("constant", "heuristic")
DRAFT_MODEL_GRID = tuple([{"rule": "adaedl", "max_draft": n} for n in (8, 12, 16, 20)] +
                         [{"rule": "static", "gamma": g} for g in (4, 8)])
PROMPT_LOOKUP_TOKENS = (5, 10, 20)
T1_ADAEDL_MAX_DRAFT = (8, 12, 16)


# --- the tunable methods: one builder each, used for grid candidates and for the scored method alike ------------

def draft_model_label(settings: dict) -> str:
    if settings.get("rule", "static") == "static":
        return f"static γ={settings.get('gamma', 4)}"
    lam = f", λ={settings['lam']}" if settings.get("lam") is not None else ""
    return f"{settings['rule']}, L_max={settings.get('max_draft', 8)}{lam}"


def assisted_label(settings: dict) -> str:
    return (f"{settings['num_assistant_tokens']} tokens, confidence {settings['assistant_confidence_threshold']}, "
            f"{settings['num_assistant_tokens_schedule']}")


# The draft precisions a comparison can run (DecodeOptions.draft_quant) and the suffix of their arms' keys; the
# float32 arm keeps the unsuffixed key every results file before int8 drafts used (their drafts were float32).
QUANT_SUFFIX = {"none": "", "int8": "-int8", "auto": "-auto"}
QUANT_WORDS = {"none": "float32 draft", "int8": "int8 draft", "auto": "draft int8 where measured faster"}


def quant_key(key: str, draft_quant: str) -> str:
    """"hf/assisted@packed", "int8" -> "hf/assisted-int8@packed" (the kernels suffix stays last)."""
    base, at, kernels = key.partition("@")
    return base + QUANT_SUFFIX[draft_quant] + at + kernels


def ours_draft_model(key: str, settings: dict, **extra) -> Method:
    draft = QUANT_WORDS[extra.get("draft_quant", "auto")]
    return ours(key, f"SpecLab draft model ({draft_model_label(settings)}; {draft})", "draft-model", **settings,
                **extra)


def ours_prompt_lookup(key: str, settings: dict, **extra) -> Method:
    return ours(key, f"SpecLab prompt lookup ({settings['gamma']} tokens, n-gram {settings['ngram']})",
                "prompt-lookup", **settings, **extra)


def hf_assisted(key: str, settings: dict, kernels: str = "packed", draft_quant: str = "auto") -> Method:
    """transformers' assisted generation, handed the same draft object as SpecLab's arms with this draft_quant."""
    where = "packed kernels" if kernels == "packed" else "stock kernels, as users run it"
    return hf(key, f"HF assisted generation ({assisted_label(settings)}; {where}; {QUANT_WORDS[draft_quant]})",
              "draft-model", kernels, draft_quant=draft_quant, **settings)


def hf_prompt_lookup(key: str, settings: dict, kernels: str = "packed") -> Method:
    where = "packed kernels" if kernels == "packed" else "stock kernels, as users run it"
    return hf(key, f"HF prompt lookup ({settings['prompt_lookup_num_tokens']} tokens, n-gram "
              f"{settings['max_matching_ngram_size']}; {where})", "prompt-lookup", kernels, **settings)


def ours_t1_adaedl(key: str, settings: dict, **extra) -> Method:
    return ours(key, f"SpecLab draft model T=1, AdaEDL (L_max={settings['max_draft']})", "draft-model",
                temperature=1.0, rule="adaedl", **settings, **extra)


@dataclass(frozen=True)
class Group:
    key: str  # the scored method whose settings this group chooses
    build: Callable[[str, dict], Method]
    grid: tuple[dict, ...]
    kinds: tuple[str, ...] | None = None  # prompt kinds it is tuned (and scored) on; None = all

    def candidate_key(self, index: int) -> str:
        return f"tune:{self.key}#{index}"

    def candidates(self) -> list[Method]:
        return [self.build(self.candidate_key(i), settings) for i, settings in enumerate(self.grid)]


def groups(args, has_draft: bool) -> list[Group]:
    """The grids for this run: prompt lookup always; the draft-model groups only with a draft model."""
    ngram = args.pl_ngram
    out = [Group("ours/prompt-lookup", ours_prompt_lookup,
                 tuple({"rule": "static", "gamma": n, "ngram": ngram} for n in PROMPT_LOOKUP_TOKENS)),
           Group("hf/prompt-lookup", hf_prompt_lookup,
                 tuple({"prompt_lookup_num_tokens": n, "max_matching_ngram_size": ngram}
                       for n in PROMPT_LOOKUP_TOKENS))]
    if has_draft:
        for quant in getattr(args, "draft_quants", None) or ["none"]:  # each side tuned on the draft it will run
            out.append(draft_model_group(quant))
            out.append(assisted_group(quant))
        if args.sweep_on:
            out.append(Group("ours/t1/adaedl", ours_t1_adaedl,
                             tuple({"max_draft": n} for n in T1_ADAEDL_MAX_DRAFT), kinds=CODE_KINDS))
    return out


def draft_model_group(draft_quant: str) -> Group:
    """SpecLab's draft model: the grid of rules and lengths, on a draft of this precision."""
    return Group(quant_key("ours/draft-model", draft_quant),
                 lambda key, settings: ours_draft_model(key, settings, draft_quant=draft_quant), DRAFT_MODEL_GRID)


def assisted_group(draft_quant: str) -> Group:
    """transformers' assisted generation: assistant tokens × confidence threshold × schedule, on the same draft."""
    return Group(quant_key("hf/assisted", draft_quant),
                 lambda key, settings: hf_assisted(key, settings, "packed", draft_quant), tuple(
                     {"num_assistant_tokens": n, "assistant_confidence_threshold": t,
                      "num_assistant_tokens_schedule": s}
                     for n in ASSISTED_TOKENS for t in ASSISTED_THRESHOLDS for s in ASSISTED_SCHEDULES))


# --- the choice -------------------------------------------------------------------------------------------------

def choose(records: list[dict], group_list: list[Group], tuning_prompts: set[str],
           reference: str = "ours/baseline") -> dict:
    """group key -> {"chosen": index, "settings", "candidates": [{key, label, settings, score, per_prompt}]}.

    Only records of `tuning_prompts` count: a scored prompt can never influence a setting."""
    kinds_of = {r["prompt"]: r["prompt_kind"] for r in records}
    tuning = [r for r in records if r["prompt"] in tuning_prompts]
    out = {}
    for group in group_list:
        kinds = group.kinds or tuple(sorted({kinds_of[p] for p in tuning_prompts if p in kinds_of}))
        rows = []
        for index, method in enumerate(group.candidates()):
            value = ratio_over(tuning, method.key, reference, kinds)
            rows.append({"key": method.key, "label": method.label, "settings": dict(group.grid[index]),
                         "score": value["median"], "per_prompt": value["per_prompt"], "pairs": value["n"]})
        scored = [i for i, row in enumerate(rows) if row["score"] is not None]
        if not scored:
            raise RuntimeError(f"tuning {group.key}: no setting completed a run on the tuning prompts")
        best = max(scored, key=lambda i: (rows[i]["score"], -i))
        out[group.key] = {"chosen": best, "settings": rows[best]["settings"], "candidates": rows,
                          "kinds": list(kinds)}
    return out


def run_tuning(group_list: list[Group], models: dict, prompts: list[Prompt], args, log) -> tuple[dict, list]:
    """Every grid setting on the tuning prompts (its kinds only), interleaved with the baseline; then the choice.
    args: tune_reps, tune_max_new."""
    decisions, records = {}, []
    baseline = ours("ours/baseline", "SpecLab baseline", "baseline")
    for kinds in dict.fromkeys(g.kinds for g in group_list):
        chosen = [g for g in group_list if g.kinds == kinds]
        subset = [p for p in prompts if kinds is None or p.kind in kinds]
        if not subset:
            continue
        log(f"  tuning {', '.join(g.key for g in chosen)} on {len(subset)} tuning prompts ...")
        candidates = [m for g in chosen for m in g.candidates()]
        done = run_suite([baseline] + candidates, models, subset, args.tune_reps, args.tune_max_new, log=log)
        decisions.update(choose(done, chosen, {p.id for p in subset}))
        records += done
    return decisions, records
