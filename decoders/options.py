"""Run options: one frozen dataclass, validated up front with messages that say how to fix the problem.

Defaults live here only; the CLI and the UI map their controls one-to-one onto these fields.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from . import registry
from .runtime.buffers import KV_CACHES
from .errors import OptionsError
from .registry import Family

# The names, from the registries (decoders/registry.py): what each method, drafter and rule is, needs and reads.
METHODS = registry.names(registry.METHODS, Family.CHAIN)  # one sequence (decoders/loop.py)
BEAM_METHODS = registry.names(registry.METHODS, Family.BEAM)  # several beams (decoders/beams/)
DRAFTERS = registry.names(registry.DRAFTERS, Family.CHAIN)  # chain drafters
TREE_DRAFTERS = registry.names(registry.DRAFTERS, Family.TREE)  # EAGLE-1's static tree, EAGLE-2, DDD, suffix
RULES = tuple(registry.RULES)
EARLY_STOPPING = ("false", "true", "never")  # beam search's stop rule, transformers' values as text
LAM_KEEP = ("adaedl", "dv")  # the λ schedule's "keep" branch (decoders/rules.py LambdaSchedule)
CONTROLLERS = ("off", "cost")
DRAFT_QUANTS = ("auto", "none", "int8")  # the draft model's linears: decoders/quantize.py  # "cost": the draft controller picks each round's cap (decoders/controller.py)
MAX_WIDTH_LIMIT = 64
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_NEW_TOKENS_LIMIT = 4096
MAX_DRAFT_LIMIT = 64
MAX_TREE_NODES = 512  # draft nodes one target forward may verify
_ALWAYS = ("model", "method", "max_new_tokens", "temperature", "record", "dtype", "device", "chat")
_SAMPLING = ("top_k", "top_p", "seed")  # greedy decoding (temperature 0) draws nothing at random


@dataclass(frozen=True)
class DecodeOptions:
    model: str = "smollm2-135m"  # registry name or hub id of the target
    method: str = "baseline"  # "baseline" | "speculative"
    drafter: str = "draft-model"  # speculative only: "draft-model" | "prompt-lookup" | "layer-skip"
    draft_model: str | None = None  # draft-model drafter; None = the registry's pairing for `model`
    draft_quant: str = "auto"  # a loaded draft model's linears: "int8" where measured faster on this CPU ("auto"),
    #                            always ("int8") or never ("none"); only q changes, so every method stays lossless
    rule: str = "static"  # draft length: "static" | "heuristic" | "max-confidence" | "adaedl"
    gamma: int = 4  # static γ; the heuristic's starting length; prompt lookup's tokens per match
    max_draft: int = 8  # cap on drafted tokens per round for adaptive rules (AdaEDL's L_max)
    lam: float | None = None  # initial λ: AdaEDL 0.5, max-confidence 0.4 when None (AdaEDL leaves it open)
    lam_keep: str = "adaedl"  # λ "keep" branch: "adaedl" (n_acc == L_max) or "dv" (n_drafted == L_max)
    controller: str = "off"  # "cost": each round's draft cap maximises expected tokens per second on this machine's
    #                          measured t(n) (decoders/controller.py), replacing γ / max_draft; "off": the rule's own
    skip_layers: tuple[int, ...] | None = None  # layer-skip: target layers to skip; None = a default middle set
    ngram: int = 3  # prompt lookup: longest n-gram to match (tries n..ngram_min)
    ngram_min: int = 1  # prompt lookup: shortest n-gram to match (vLLM's n-gram proposer: prompt_lookup_min, 5)
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int = 0
    record: bool = True  # False: keep counters only (for measuring the recording's cost); tokens are identical
    dtype: str = "auto"  # "auto" picks by device (see decoders/runtime/models.py)
    device: str = "auto"
    kv_cache: str = "auto"  # "dynamic" (transformers' DynamicCache), "static" (one preallocated buffer per model, read
    #                         as growing views), "fixed" (the buffer read whole at bucketed widths: what CUDA graphs
    #                         replay), "auto" (dynamic, or fixed when cuda_graphs asks for it): decoders/runtime/buffers.py
    cuda_graphs: bool = False  # replay the fixed-shape forwards as captured CUDA graphs (a GPU only; decoders/runtime/graphs.py)
    chat: bool = True  # apply the model's chat template to the prompt
    width: int = 8  # beam methods: beams kept (DSBD: W, the draft draws per layer and the widest layer)
    min_width: int = 1  # DSBD: narrowest layer (K_min)
    thres: float = 0.7  # DSBD: a layer's width is the largest its W drafts produce with probability >= thres
    one_input_beam: bool = False  # DSBD memory mode: carry one beam between iterations (one target KV row)
    length_penalty: float = 1.0  # beam search: finished score = sum log p / generated_length ** length_penalty
    early_stopping: str = "false"  # beam search: "false" (heuristic) | "true" (stop at `width` finished) | "never"
    tree_k: int = 10  # EAGLE-2 / DDD: top-k children per expanded node (EAGLE-2 paper: K = 10)
    tree_depth: int = 6  # EAGLE-2: expansion steps D, the deepest draft (EAGLE-2 paper: 6)
    tree_m: int = 59  # EAGLE-2 / DDD: draft nodes sent to the target (EAGLE-2 paper: 60 tokens with the root)
    ddd_checks: tuple[int, ...] = (5, 7, 9)  # DDD paper: the expansion steps S where confidence is checked
    ddd_x: float = -0.3  # DDD paper: stop growing when H = logsumexp(frontier log-values) < x
    ddd_steps: int = 11  # DDD paper: at most n expansion steps
    ddd_width: int = 10  # DDD paper: beam width w (frontier nodes kept per step)
    eagle_head: str | None = None  # tree drafters: grow with an EAGLE head, not the draft model: a head folder, a
    #                                hub id, or "auto" (the shipped or trained head of `model`); None = the draft model
    self_weights: str = "auto"  # early-exit / prophet: a trained weights folder, or "auto" (the shipped or trained
    #                            ones for `model`: decoders/selfdraft/store.py)
    tree_paths: tuple[tuple[int, ...], ...] | None = None  # eagle1: the static tree as rank paths, e.g. ((0,), (1,),
    #                                                        (0, 0)); None = SpecLab's 24-node default (tree_draft.py)
    suffix_depth: int = 24  # suffix: the suffix tree's depth, longest matched tail + what follows (vLLM's default)
    suffix_tokens: int = 16  # suffix: most draft nodes per round (vLLM: num_speculative_tokens, 32 on a GPU)
    suffix_factor: float = 2.0  # suffix: a matched tail of L tokens earns at most floor(factor * L) drafts; vLLM: 1.0
    #                             (a GPU batch pays for every wasted draft); 2 here: chosen on the tuning prompts by
    #                             python -m bench.suffix --tune (bench/results/suffix-tune-smollm2-135m.md)
    suffix_min_prob: float = 0.1  # suffix: draft a continuation only if count-estimated p >= this (vLLM 0.1)

    @classmethod
    def from_dict(cls, data: dict) -> "DecodeOptions":
        """The inverse of to_dict (JSON has lists where the options hold tuples)."""
        data = dict(data)
        for name in ("skip_layers", "ddd_checks"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        if data.get("tree_paths") is not None:
            data["tree_paths"] = tuple(tuple(path) for path in data["tree_paths"])
        return cls(**data)

    def validate(self) -> "DecodeOptions":
        """Raise OptionsError naming the field and the fix; return self so calls can chain."""
        family = registry.method(self.method).family  # an unknown method lists the known ones
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("draft_quant", self.draft_quant, DRAFT_QUANTS)
        _one_of("kv_cache", self.kv_cache, KV_CACHES)
        if self.cuda_graphs not in (True, False):
            raise OptionsError(f"cuda_graphs is on (True) or off (False), got {self.cuda_graphs!r}")
        if self.cuda_graphs and self.kv_cache in ("dynamic", "static"):
            raise OptionsError(f"cuda_graphs needs every step to have a fixed shape, which kv_cache='{self.kv_cache}' "
                               "does not give; set kv_cache='fixed' (or 'auto')")
        _int_range("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS_LIMIT, _MAX_NEW_TOKENS_FIX)
        if not 0.0 <= self.temperature <= 5.0:
            raise OptionsError(f"temperature must be between 0 (greedy) and 5, got {self.temperature}")
        if self.top_k < 0:
            raise OptionsError(f"top_k must be 0 (off) or a positive count, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise OptionsError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.method == "speculative":
            self._validate_speculative()
        if family == Family.BEAM:
            self._validate_beams()
        return self

    def _validate_beams(self) -> None:
        _int_range("width", self.width, 1, MAX_WIDTH_LIMIT)
        if self.method == "beam-search":
            _one_of("early_stopping", self.early_stopping, EARLY_STOPPING)
            if self.temperature > 0:
                raise OptionsError("beam-search picks the best beams deterministically and ignores temperature; set "
                                   "temperature 0, or use method 'beam-sampling' to draw beams at random")
            return
        if self.temperature == 0:
            raise OptionsError(f"{self.method} draws beams at random; set temperature above 0 (1.0 = the model's own "
                               "distribution), or use method 'beam-search' for deterministic beams")
        if 0 < self.top_k < self.width:
            raise OptionsError(f"width {self.width} is more than the {self.top_k} (beam, token) pairs top_k keeps, "
                               f"so beams would repeat; raise top_k to at least {self.width} or lower width to "
                               f"{self.top_k}")
        if self.method == "dsbd":
            _int_range("gamma", self.gamma, 1, MAX_DRAFT_LIMIT)
            _int_range("min_width", self.min_width, 1, self.width)
            if not 0.0 < self.thres <= 1.0:
                raise OptionsError(f"thres must be in (0, 1] (0.7 = the DSBD code's default), got {self.thres}")

    def _validate_speculative(self) -> None:
        spec = registry.drafter(self.drafter)  # an unknown drafter lists the known ones
        self._refuse_fields_the_drafter_ignores(spec)
        if spec.family == Family.TREE:
            self._validate_tree(spec)
            return
        registry.rule(self.rule)  # an unknown rule lists the known ones
        _int_range("gamma", self.gamma, 1, MAX_DRAFT_LIMIT)
        _int_range("max_draft", self.max_draft, 1, MAX_DRAFT_LIMIT)
        if self.lam is not None and not 0.0 <= self.lam <= 1.0:
            raise OptionsError(f"lam (the initial λ) must be in [0, 1], got {self.lam}")
        _one_of("lam_keep", self.lam_keep, LAM_KEEP)
        _one_of("controller", self.controller, CONTROLLERS)
        if self.controller == "cost" and self.rule == "heuristic":
            raise OptionsError("the heuristic rule is itself a draft-length controller (+2 / −1 per round); use "
                               "controller 'off' with it, or rule 'static', 'adaedl' or 'max-confidence' with the "
                               "cost controller")
        if self.rule not in spec.rules:
            raise OptionsError(f"rule '{self.rule}' judges the draft's probability distribution, but {spec.label} "
                               f"copies tokens and has none; use rule {' or '.join(repr(r) for r in spec.rules)} "
                               f"with {spec.label}")
        if "ngram" in spec.fields:
            _int_range("ngram", self.ngram, 1, 8)
            _int_range("ngram_min", self.ngram_min, 1, self.ngram, lambda _: "the shortest n-gram cannot be longer "
                       f"than the longest (ngram {self.ngram}); lower ngram_min or raise ngram")
        if "skip_layers" in spec.fields and self.skip_layers is not None and 0 in self.skip_layers:
            raise OptionsError("layer 0 cannot be skipped (the cache length is read from it); drop 0 from skip_layers")

    def _refuse_fields_the_drafter_ignores(self, spec) -> None:
        """A field set for another drafter would be silently ignored: say which drafters read it instead."""
        for name in ("skip_layers", "draft_model", "eagle_head", "tree_paths"):
            if getattr(self, name) is not None and name not in spec.fields:
                readers = [d.name for d in registry.DRAFTERS.values() if name in d.fields]
                raise OptionsError(f"{name} only applies to drafter {' / '.join(repr(r) for r in readers)} (got "
                                   f"drafter '{self.drafter}'); remove it or set drafter='{readers[0]}'")

    def _validate_tree(self, spec) -> None:
        """The tree's own shape bounds its depth, so the draft-length rule and gamma do not apply. Each field is
        checked where the drafter's spec reads it (registry.DRAFTERS[...].fields), never by the drafter's name."""
        _one_of("controller", self.controller, CONTROLLERS)
        if self.controller == "cost" and "controller" not in spec.fields:
            raise OptionsError(f"{spec.label} has no cost controller (its tree's size is its own rule): use "
                               f"controller 'off' with drafter '{self.drafter}'")
        if "tree_k" in spec.fields:
            _int_range("tree_k", self.tree_k, 1, MAX_WIDTH_LIMIT)
        if "tree_m" in spec.fields:
            _int_range("tree_m", self.tree_m, 1, MAX_TREE_NODES)
        if self.eagle_head is not None and self.draft_model is not None:
            raise OptionsError("a tree grows from either an EAGLE head or a draft model; drop draft_model or eagle_head")
        if "tree_paths" in spec.fields:
            self._validate_paths()
        if "tree_depth" in spec.fields:
            _int_range("tree_depth", self.tree_depth, 1, MAX_DRAFT_LIMIT)
        if "ddd_steps" in spec.fields:
            self._validate_ddd()
        if "suffix_depth" in spec.fields:
            self._validate_suffix()

    def _validate_suffix(self) -> None:
        _int_range("suffix_depth", self.suffix_depth, 2, MAX_DRAFT_LIMIT)
        _int_range("suffix_tokens", self.suffix_tokens, 1, MAX_TREE_NODES)
        if not 0.0 < self.suffix_factor <= 64.0:
            raise OptionsError(f"suffix_factor must be above 0 and at most 64 (a matched tail of L tokens earns "
                               f"floor(factor · L) drafts; vLLM's default is 1), got {self.suffix_factor}")
        if not 0.0 <= self.suffix_min_prob <= 1.0:
            raise OptionsError(f"suffix_min_prob is a probability estimated from counts and must be in [0, 1] (vLLM's "
                               f"default is 0.1), got {self.suffix_min_prob}")

    def _validate_ddd(self) -> None:
        _int_range("ddd_steps", self.ddd_steps, 1, MAX_DRAFT_LIMIT)
        _int_range("ddd_width", self.ddd_width, 1, MAX_WIDTH_LIMIT)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 2 for s in self.ddd_checks):
            raise OptionsError(f"ddd_checks must be whole expansion steps of 2 or more (step 1 has no frontier to "
                               f"judge yet), got {list(self.ddd_checks)}; the paper's are 5, 7, 9")
        if self.ddd_x != self.ddd_x or self.ddd_x > 0:
            raise OptionsError(f"ddd_x is a log-probability threshold and must be 0 or below (-inf = never stop), "
                               f"got {self.ddd_x}; the paper's is -0.3")

    def _validate_paths(self) -> None:
        if self.tree_paths is None:
            return
        paths = [tuple(p) for p in self.tree_paths]
        if not paths or len(paths) > MAX_TREE_NODES or len(set(paths)) != len(paths):
            raise OptionsError(f"tree_paths must list 1 to {MAX_TREE_NODES} distinct paths, got {len(paths)} "
                               f"({len(paths) - len(set(paths))} repeated)")
        if any(not p or len(p) > MAX_DRAFT_LIMIT or any(not isinstance(r, int) or not 0 <= r < MAX_WIDTH_LIMIT
                                                        for r in p) for p in paths):
            raise OptionsError(f"each tree path lists, per depth, a candidate rank from 0 (the draft's likeliest "
                               f"token) to {MAX_WIDTH_LIMIT - 1}, at most {MAX_DRAFT_LIMIT} deep, e.g. 0; 1; 0,0")
        missing = [p for p in paths if len(p) > 1 and p[:-1] not in set(paths)]
        if missing:
            raise OptionsError(f"tree path {','.join(map(str, missing[0]))} has no parent path "
                               f"{','.join(map(str, missing[0][:-1]))}; add it (every node's parent must be in the tree)")

    def fields_in_use(self) -> frozenset[str]:
        return fields_in_use(self.method, self.drafter, self.rule, self.temperature, self.controller)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["skip_layers"] = list(self.skip_layers) if self.skip_layers is not None else None
        data["ddd_checks"] = list(self.ddd_checks)
        data["tree_paths"] = [list(p) for p in self.tree_paths] if self.tree_paths is not None else None
        return data


def rules_for(drafter: str) -> tuple[str, ...]:
    """The draft-length rules a run with this drafter accepts (registry: a rule that judges q needs a drafter with q).
    A tree's shape sets its own depth, so its rule field is unused and any rule is accepted."""
    spec = registry.DRAFTERS.get(drafter)
    return spec.rules if spec is not None and spec.rules else RULES


def initial_lam(rule: str) -> float | None:
    """The initial λ a rule starts from when lam is None (None: the rule has no λ)."""
    spec = registry.RULES.get(rule)
    return spec.initial_lam if spec is not None else None


def fields_in_use(method: str, drafter: str, rule: str, temperature: float, controller: str = "off") -> frozenset[str]:
    """The fields that change a run with these choices; the others are ignored, so the UI hides them. The cost
    controller picks a chain's cap each round, so γ and max_draft then change nothing."""
    used = set(_ALWAYS) | (set(_SAMPLING) if temperature > 0 else set())
    spec = registry.METHODS.get(method)
    used |= set(spec.fields) if spec is not None else set()
    if "draft_model" in used or method == "dsbd":
        used.add("draft_quant")
    if method == "speculative" and drafter in registry.DRAFTERS:
        drafter_spec = registry.DRAFTERS[drafter]
        used |= set(drafter_spec.fields)
        if drafter_spec.family == Family.CHAIN:
            used |= {"rule", *(registry.RULES[rule].fields if rule in registry.RULES else ())}
            if controller == "cost" and "controller" in used:
                used -= {"gamma", "max_draft"}
    return frozenset(used)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OptionsError(f"unknown {name} {value!r}; choose one of: {', '.join(allowed)}")


def _int_range(name: str, value: int, low: int, high: int, fix=None) -> None:
    """`fix(value)`: an optional sentence saying what to do instead (appended after a colon)."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        hint = fix(value) if fix else ""
        raise OptionsError(f"{name} must be a whole number from {low} to {high}, got {value!r}" +
                           (f": {hint}" if hint else ""))


def _max_new_tokens_fix(value) -> str:
    """Say why out loud instead of generating 1 token for 0 or quietly clamping 100000 (issue 24)."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        return "a run must generate at least 1 new token after the prompt; set max new tokens to 1 or more"
    if isinstance(value, int) and not isinstance(value, bool):
        return (f"SpecLab stops a run at {MAX_NEW_TOKENS_LIMIT} new tokens (and the prompt plus them must fit the "
                f"model's context); set max new tokens to {MAX_NEW_TOKENS_LIMIT} or fewer")
    return ""


_MAX_NEW_TOKENS_FIX = _max_new_tokens_fix
