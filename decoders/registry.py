"""Every method, drafter and draft-length rule SpecLab knows, by name: what it is, what it needs, which option
fields it reads (their defaults are DecodeOptions' own: options.py holds every default), and how to build it.

options.py validates against these tables, api.py builds from them, and the app's pickers, the Race and bench read
them: nothing else keeps a list of names or an if-chain over them. Adding a drafter is one class in
decoders/drafters/ and one DrafterSpec line in DRAFTERS below (decoders/README.md walks through it).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable

from .drafters import (CrossTokenizerDrafter, DraftModelDrafter, Drafter, DynamicTreeDrafter, EagleTreeDrafter,
                       LayerSkipDrafter, NoDraft, PromptLookupDrafter, STATIC_TREE, TreeShape)
from .drafters.suffix import Settings as SuffixSettings, SuffixDrafter
from .errors import OptionsError
from .runtime.residency import model_bytes
from .selfdraft import spec as selfdraft_spec
from .rules import AdaEDLRule, DraftRule, HeuristicRule, LambdaSchedule, MaxConfidenceRule, StaticRule

if TYPE_CHECKING:
    from .runtime.runner import CachedModel

# A run's decoders.options.DecodeOptions. Not imported, not even for types: options.py validates against these
# tables, so the dependency runs one way (options -> registry) and tests/test_import_graph.py keeps it so.
Options = Any


class Family(StrEnum):
    """How a method's output is made: one sequence verified round by round (chain drafts or none), one sequence
    verified a tree at a time, or several beams (decoders/beams)."""

    CHAIN = "chain"
    TREE = "tree"
    BEAM = "beam"


@dataclass(frozen=True)
class BuildContext:
    """What a drafter may be built from: the run's options, the cached target, and the loaded models."""

    options: Options
    runner: "CachedModel"  # the target with its KV cache (decoders/runtime/runner.py)
    target: object  # the loaded target (decoders.api.LanguageModel)
    draft: object | None  # the loaded draft model, when uses_draft_model(options)
    store: object | None = None  # the caller's store of earlier outputs (suffix decoding: drafters/suffix.py)


# ---------------------------------------------------------------- draft-length rules

@dataclass(frozen=True)
class RuleSpec:
    name: str
    label: Callable[[Options], str]  # for tables and traces, e.g. "static γ=4"
    fields: tuple[str, ...]  # the option fields it reads
    build: Callable[[Options], DraftRule]
    judges_q: bool = False  # True: it reads the draft's distribution q, so a drafter without one cannot use it
    initial_lam: float | None = None  # the λ it starts from when options.lam is None (None: the rule has no λ)
    help: str = ""


def _schedule(options: Options, rule: str) -> LambdaSchedule:
    lam = RULES[rule].initial_lam if options.lam is None else options.lam
    return LambdaSchedule(lam, options.max_draft, keep=options.lam_keep)


RULES: dict[str, RuleSpec] = {spec.name: spec for spec in [
    RuleSpec("static", lambda o: "cost-aware length" if o.controller == "cost" else f"static γ={o.gamma}",
             ("gamma", "controller"), lambda o: StaticRule(o.gamma), help="always γ tokens"),
    RuleSpec("heuristic", lambda o: "HF heuristic", ("gamma", "max_draft"),
             lambda o: HeuristicRule(o.gamma, o.max_draft), help="+2 after a full accept, −1 otherwise"),
    RuleSpec("max-confidence", lambda o: "max-confidence", ("max_draft", "lam", "lam_keep", "controller"),
             lambda o: MaxConfidenceRule(_schedule(o, "max-confidence")), judges_q=True, initial_lam=0.4,
             help="stop when the draft's top probability < λ"),
    RuleSpec("adaedl", lambda o: "AdaEDL", ("max_draft", "lam", "lam_keep", "controller"),
             lambda o: AdaEDLRule(_schedule(o, "adaedl")), judges_q=True, initial_lam=0.5,
             help="stop when 1 − √(γ·entropy) < λ; λ follows the running acceptance"),
]}


# ---------------------------------------------------------------- drafters

@dataclass(frozen=True)
class DrafterSpec:
    name: str
    family: Family  # CHAIN or TREE
    label: str  # for tables and traces
    fields: tuple[str, ...]  # the option fields it reads
    build: Callable[[BuildContext], Drafter]
    offers_q: bool = True  # False: it copies tokens (no draft distribution), so rules that judge q cannot steer it
    uses_draft_model: Callable[[Options], bool] = lambda options: False
    help: str = ""
    cost_prior: Callable[[BuildContext], float] = lambda ctx: _size_ratio(ctx)  # c before the run times its own
    verify_share: Callable[[BuildContext], float] = lambda ctx: 1.0  # of a full target forward, its verification
    depth: Callable[[Options], int] | None = None  # TREE: the deepest a round's tree may grow (its static rule)
    nodes: Callable[[Options], int] | None = None  # TREE: the most drafts a round sends (the verification's width)
    describe: Callable[[Options], str] | None = None  # TREE: its label after "speculative · ", shape included
    batched: str | None = None  # its form for B rows at once: a key of decoders/batch/drafters.py FORMS ("per-row":
    #                             one of it per row, for drafters without model state); None: no batched form
    own_tokenizer: bool = False  # True: its draft model may have another tokenizer (the API checks it can spell text)
    calibrated: bool = False  # TREE: its node values are calibrated chances already (the cost controller keeps κ 1)

    def __post_init__(self):
        if self.family == Family.TREE and None in (self.depth, self.nodes, self.describe):
            raise ValueError(f"tree drafter {self.name!r} needs depth= and nodes= (how deep a round's tree may grow "
                             "and how many drafts it may send) and describe= (its label): no draft-length rule sets "
                             "them for a tree")

    @property
    def rules(self) -> tuple[str, ...]:
        """The draft-length rules that can steer it (a tree's shape sets its own depth: none)."""
        if self.family == Family.TREE:
            return ()
        return tuple(name for name, rule in RULES.items() if self.offers_q or not rule.judges_q)


def _layer_skip(ctx: BuildContext) -> Drafter:
    skip = ctx.options.skip_layers
    try:
        return LayerSkipDrafter(ctx.runner, list(skip) if skip is not None else None)
    except ValueError as err:  # a layer index the target does not have
        raise OptionsError(str(err)) from None


def _tree(ctx: BuildContext) -> Drafter:
    """A tree grown by the pair's draft model, or by an EAGLE head reading the target's features."""
    options = ctx.options
    if options.eagle_head is not None:
        return EagleTreeDrafter(_eagle_head(options, ctx.target), tree_shape(options), name=f"{options.drafter}-head")
    return DynamicTreeDrafter(ctx.draft.model, tree_shape(options), name=options.drafter)


def _size_ratio(ctx: BuildContext) -> float:
    """A first guess at c (one draft step / one target step): the bytes of weights the draft reads per step over
    the target's (a one-token step streams every weight once). Bytes, not parameters(): packed and int8 weights
    live outside parameters(), so counting parameters left only the embeddings of a packed target and an int8
    draft (Qwen 0.5B int8 vs 1.5B: 0.58, where a measured step costs 0.13-0.2 of the target's), and the first
    rounds of every controlled run drafted one token until the run had timed its own."""
    if ctx.draft is None:
        return 0.5
    sizes = [model_bytes(lm.model) for lm in (ctx.draft, ctx.target)]
    return sizes[0] / max(sizes[1], 1)


def _layers_kept(ctx: BuildContext) -> float:
    """Layer skip runs the target's stem without the skipped layers: roughly that share of a target step."""
    from .drafters import default_skip_layers
    from .runtime.runner import decoder_layers

    total = len(decoder_layers(ctx.runner.model))
    skipped = ctx.options.skip_layers or default_skip_layers(total)
    return 1.0 - len(skipped) / total


def _tree_step_prior(ctx: BuildContext) -> float:
    """A tree's expansion step: one draft-model forward over the frontier, or one EAGLE-head layer (small)."""
    return 0.1 if ctx.options.eagle_head is not None else _size_ratio(ctx)


def _grown_by_draft_model(options: Options) -> bool:
    return options.eagle_head is None


def _tree_steps(options: Options) -> int:
    return tree_shape(options).steps


def _tree_nodes(options: Options) -> int:
    return tree_shape(options).m


def _grown_tree(options: Options) -> str:
    """"draft-model tree · EAGLE-2 (K=10, D=6, M=59)": what grew it, and its shape."""
    shape = tree_shape(options)
    grower = "draft-model" if options.eagle_head is None else "EAGLE-head"
    detail = {"eagle1": f"({shape.m} nodes, depth {shape.steps})",
              "ddd": f"(K={shape.k}, M={shape.m}, n={shape.steps}, w={shape.beam})"}.get(
        options.drafter, f"(K={shape.k}, D={shape.steps}, M={shape.m})")
    return f"{grower} tree · {DRAFTERS[options.drafter].label} {detail}"


def _suffix(ctx: BuildContext) -> Drafter:
    o = ctx.options
    return SuffixDrafter(SuffixSettings(o.suffix_depth, o.suffix_tokens, o.suffix_factor, o.suffix_min_prob),
                         tuple(ctx.target.eos_token_ids), ctx.store)


_TREE_FIELDS = ("draft_model", "eagle_head", "controller")
DRAFTERS: dict[str, DrafterSpec] = {spec.name: spec for spec in [
    DrafterSpec("draft-model", Family.CHAIN, "draft model", ("draft_model",),
                lambda ctx: DraftModelDrafter(ctx.draft.model), uses_draft_model=lambda options: True,
                help="a smaller model of the same family", batched="draft-model"),
    DrafterSpec("prompt-lookup", Family.CHAIN, "prompt lookup", ("ngram", "ngram_min"),
                lambda ctx: PromptLookupDrafter(ctx.options.ngram, tuple(ctx.target.eos_token_ids),
                                                ctx.options.ngram_min), offers_q=False,
                help="copy what followed the same n-gram earlier in the text", cost_prior=lambda ctx: 0.0,
                batched="per-row"),
    DrafterSpec("layer-skip", Family.CHAIN, "layer skip", ("skip_layers",), _layer_skip,
                help="the target itself with some layers skipped", cost_prior=_layers_kept,
                batched="layer-skip"),
    DrafterSpec("early-exit", Family.CHAIN, "early exit", ("self_weights",), selfdraft_spec.builder("early-exit"),
                help="the target's first k layers + a trained block + its LM head; verification reuses layers 1..k",
                cost_prior=selfdraft_spec.cost_prior("early-exit"), verify_share=selfdraft_spec.early_exit_share,
                batched="early-exit"),
    DrafterSpec("prophet", Family.CHAIN, "prophet", ("self_weights",), selfdraft_spec.builder("prophet"),
                help="a small trained decoder that drafts from the target's last hidden state",
                cost_prior=selfdraft_spec.cost_prior("prophet"), batched="prophet"),
    DrafterSpec("cross-tokenizer", Family.CHAIN, "cross-tokenizer draft", ("draft_model",),
                CrossTokenizerDrafter.from_context, uses_draft_model=lambda options: True, own_tokenizer=True,
                help="a small model with its own tokenizer: its text is re-tokenized for the target"),
    DrafterSpec("eagle1", Family.TREE, "EAGLE static tree", _TREE_FIELDS + ("tree_paths",), _tree,
                uses_draft_model=_grown_by_draft_model, help="a fixed tree of the draft's top picks (EAGLE-1)",
                cost_prior=_tree_step_prior, depth=_tree_steps, nodes=_tree_nodes, describe=_grown_tree),
    DrafterSpec("eagle2", Family.TREE, "EAGLE-2", _TREE_FIELDS + ("tree_k", "tree_depth", "tree_m"), _tree,
                uses_draft_model=_grown_by_draft_model, cost_prior=_tree_step_prior, depth=_tree_steps,
                nodes=_tree_nodes, describe=_grown_tree,
                help="a tree of drafts grown by confidence (EAGLE-2), verified in one forward"),
    DrafterSpec("ddd", Family.TREE, "DDD",
                _TREE_FIELDS + ("tree_k", "tree_m", "ddd_checks", "ddd_x", "ddd_steps", "ddd_width"), _tree,
                uses_draft_model=_grown_by_draft_model, cost_prior=_tree_step_prior, depth=_tree_steps,
                nodes=_tree_nodes, describe=_grown_tree,
                help="EAGLE-2 that stops growing when the tree's confidence falls (Dynamic Depth Decoding)"),
    DrafterSpec("suffix", Family.TREE, "suffix decoding",
                ("suffix_depth", "suffix_tokens", "suffix_factor", "suffix_min_prob", "controller"), _suffix,
                offers_q=False, calibrated=True,
                cost_prior=lambda ctx: 0.0, depth=lambda o: o.suffix_tokens, nodes=lambda o: o.suffix_tokens,
                describe=lambda o: f"suffix tree (≤{o.suffix_tokens} nodes, {o.suffix_factor:g}×match, "
                                   f"p ≥ {o.suffix_min_prob:g})",
                help="copy the continuations that followed the text's tail in the prompt, the output and earlier "
                     "outputs, as a tree weighted by how often each followed (SuffixDecoding)"),
]}


# ---------------------------------------------------------------- methods

@dataclass(frozen=True)
class MethodSpec:
    name: str
    family: Family  # CHAIN: one sequence (decoders/loop.py; its drafter may grow trees); BEAM: decoders/beams
    fields: tuple[str, ...]  # the option fields it reads beyond the ones every run reads
    uses_draft_model: Callable[[Options], bool] = lambda options: False
    help: str = ""


METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in [
    MethodSpec("baseline", Family.CHAIN, (), help="one target forward per token"),
    MethodSpec("speculative", Family.CHAIN, ("drafter",),
               uses_draft_model=lambda options: DRAFTERS[options.drafter].uses_draft_model(options),
               help="a drafter proposes, the target verifies (decoders/verify.py)"),
    MethodSpec("beam-search", Family.BEAM, ("width", "length_penalty", "early_stopping"),
               help="the width best beams, deterministically"),
    MethodSpec("beam-sampling", Family.BEAM, ("width",), help="width beams drawn at random"),
    MethodSpec("dsbd", Family.BEAM, ("width", "min_width", "thres", "gamma", "one_input_beam", "draft_model"),
               uses_draft_model=lambda options: True,
               help="speculative beam decoding: a draft forest verified by the target, with a dynamic width"),
]}


def method(name: str) -> MethodSpec:
    return _lookup(METHODS, name, "method")


def drafter(name: str) -> DrafterSpec:
    return _lookup(DRAFTERS, name, "drafter")


def rule(name: str) -> RuleSpec:
    return _lookup(RULES, name, "draft-length rule")


def names(table: dict, family: Family | None = None) -> tuple[str, ...]:
    return tuple(name for name, spec in table.items() if family is None or spec.family == family)


def uses_draft_model(options: Options) -> bool:
    """Does this run load a draft model (the draft-model drafter, a tree grown by it, DSBD)?"""
    return method(options.method).uses_draft_model(options)


def is_tree(options: Options) -> bool:
    return options.method == "speculative" and drafter(options.drafter).family == Family.TREE


def build_drafter(ctx: BuildContext) -> Drafter:
    if ctx.options.method == "baseline":
        return NoDraft()
    return drafter(ctx.options.drafter).build(ctx)


def run_costs(ctx: BuildContext, prompt_tokens: int = 0) -> "RunCosts | None":
    """For controller "cost": the target's verification curve on this machine (measured once, then cached: a few
    seconds for SmolLM2, about half a minute for Qwen 1.5B; again when it was taken on a busy machine or at a very
    different context, decoders/costs.py for_run), the drafter's prior c and its verification's share of a forward."""
    if ctx.options.controller != "cost" or ctx.options.method != "speculative":
        return None
    from . import costs

    curve, used = costs.for_run(ctx.target, prompt_tokens, path=ctx.runner.plan.path)  # priced on the run's own path
    spec = drafter(ctx.options.drafter)
    return RunCosts(t=lambda n: curve.priced(n, tree=is_tree(ctx.options)), c=spec.cost_prior(ctx), curve=curve,
                    verify_share=spec.verify_share(ctx), used=used)


def build_rule(options: Options, costs: "RunCosts | None" = None) -> DraftRule | None:
    """The baseline has no rule; a tree's shape sets its depth, so it gets a static rule of that many steps; with
    controller "cost" a chain's rule is wrapped by the draft controller, which needs the run's measured costs."""
    if options.method != "speculative":
        return None
    controlled = options.controller == "cost"
    if controlled and costs is None:
        raise OptionsError("controller 'cost' needs this machine's cost curve; decode through decoders.api")
    from .controller import CostAwareRule, TreeCostRule

    if is_tree(options):
        spec = drafter(options.drafter)
        steps = spec.depth(options)
        if not controlled:
            return StaticRule(steps)
        return TreeCostRule(costs.t, costs.c, steps, learn_kappa=not spec.calibrated)
    built = rule(options.rule).build(options)
    return CostAwareRule(built, costs.t, costs.c, verify_share=costs.verify_share) if controlled else built


@dataclass(frozen=True)
class RunCosts:
    """What the draft controller weighs: t(n)/t(1) of the target's verification and a prior draft step cost c."""

    t: Callable[[int], float]
    c: float
    curve: object = None  # the decoders.costs.CostCurve behind t
    verify_share: float = 1.0  # of a full target forward, what the drafter's verification runs (early exit < 1)
    used: dict | None = None  # which curve and why (decoders/costs.py describe_use): trace.totals["cost_curve"]


def label(options: Options) -> str:
    """The chain and tree methods' human label (beam methods: decoders/beams/run.py)."""
    if options.method == "baseline":
        return "autoregressive baseline"
    spec = drafter(options.drafter)
    if spec.family == Family.TREE:
        priced = " · cost-aware size" if options.controller == "cost" else ""
        return f"speculative · {spec.describe(options)}{priced}"
    controlled = " · cost-aware cap" if options.controller == "cost" and options.rule != "static" else ""
    return f"speculative · {spec.label} · {rule(options.rule).label(options)}{controlled}"


def tree_shape(options: Options) -> TreeShape:
    """EAGLE-1's static paths, EAGLE-2's (K, D, M), or DDD's (K, M, S, x, n, w), from the options."""
    if options.drafter == "eagle1":
        return TreeShape.static(options.tree_paths or STATIC_TREE)
    if options.drafter == "ddd":
        return TreeShape.ddd(k=options.tree_k, m=options.tree_m, checks=options.ddd_checks, threshold=options.ddd_x,
                             steps=options.ddd_steps, width=options.ddd_width)
    return TreeShape(k=options.tree_k, steps=options.tree_depth, m=options.tree_m)


def _eagle_head(options: Options, target):
    """The EAGLE head a tree drafter grows from: a folder or hub id, or "auto" (shipped or trained for the target)."""
    from .eagle.official import EagleHeadError, load_official, locate_head

    try:
        source = locate_head(options.model) if options.eagle_head == "auto" else options.eagle_head
        return load_official(source, target.model)
    except EagleHeadError as err:
        raise OptionsError(str(err)) from None


def _lookup(table: dict, name: str, what: str):
    try:
        return table[name]
    except KeyError:
        raise OptionsError(f"unknown {what} {name!r}; choose one of: {', '.join(table)}") from None
