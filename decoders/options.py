"""Run options: one frozen dataclass, validated up front with messages that say how to fix the problem.

Defaults live here only; the CLI and the UI map their controls one-to-one onto these fields.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

METHODS = ("baseline", "speculative")
DRAFTERS = ("draft-model", "prompt-lookup", "layer-skip")
RULES = ("static", "heuristic", "max-confidence", "adaedl")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_NEW_TOKENS_LIMIT = 4096
MAX_DRAFT_LIMIT = 64


class OptionsError(ValueError):
    """Invalid or incompatible options; the message says how to fix them."""


@dataclass(frozen=True)
class DecodeOptions:
    model: str = "smollm2-135m"  # registry name or hub id of the target
    method: str = "baseline"  # "baseline" | "speculative"
    drafter: str = "draft-model"  # speculative only: "draft-model" | "prompt-lookup" | "layer-skip"
    draft_model: str | None = None  # draft-model drafter; None = the registry's pairing for `model`
    rule: str = "static"  # draft length: "static" | "heuristic" | "max-confidence" | "adaedl"
    gamma: int = 4  # static γ; the heuristic's starting length; prompt lookup's tokens per match
    max_draft: int = 8  # cap on drafted tokens per round for adaptive rules (AdaEDL's L_max)
    lam: float | None = None  # initial λ: AdaEDL 0.5, max-confidence 0.4 when None (AdaEDL leaves it open)
    lam_keep: str = "adaedl"  # λ "keep" branch: "adaedl" (n_acc == L_max) or "dv" (n_drafted == L_max)
    skip_layers: tuple[int, ...] | None = None  # layer-skip: target layers to skip; None = a default middle set
    ngram: int = 3  # prompt lookup: longest n-gram to match (tries n..1)
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int = 0
    record: bool = True  # False: keep counters only (for measuring the recording's cost); tokens are identical
    dtype: str = "auto"  # "auto" picks by device (see decoders/models.py)
    device: str = "auto"
    chat: bool = True  # apply the model's chat template to the prompt

    def validate(self) -> "DecodeOptions":
        """Raise OptionsError naming the field and the fix; return self so calls can chain."""
        _one_of("method", self.method, METHODS)
        _one_of("dtype", self.dtype, DTYPES)
        _int_range("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS_LIMIT)
        if not 0.0 <= self.temperature <= 5.0:
            raise OptionsError(f"temperature must be between 0 (greedy) and 5, got {self.temperature}")
        if self.top_k < 0:
            raise OptionsError(f"top_k must be 0 (off) or a positive count, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise OptionsError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.method == "speculative":
            self._validate_speculative()
        return self

    def _validate_speculative(self) -> None:
        _one_of("drafter", self.drafter, DRAFTERS)
        _one_of("rule", self.rule, RULES)
        _int_range("gamma", self.gamma, 1, MAX_DRAFT_LIMIT)
        _int_range("max_draft", self.max_draft, 1, MAX_DRAFT_LIMIT)
        if self.lam is not None and not 0.0 <= self.lam <= 1.0:
            raise OptionsError(f"lam (the initial λ) must be in [0, 1], got {self.lam}")
        _one_of("lam_keep", self.lam_keep, ("adaedl", "dv"))
        if self.drafter == "prompt-lookup" and self.rule in ("adaedl", "max-confidence"):
            raise OptionsError(
                f"rule '{self.rule}' judges the draft's probability distribution, but prompt lookup copies tokens "
                "and has none; use rule 'static' or 'heuristic' with prompt lookup")
        if self.drafter == "prompt-lookup":
            _int_range("ngram", self.ngram, 1, 8)
        if self.skip_layers is not None and self.drafter != "layer-skip":
            raise OptionsError("skip_layers only applies to the 'layer-skip' drafter; remove it or set drafter='layer-skip'")
        if self.drafter == "layer-skip" and self.skip_layers is not None and 0 in self.skip_layers:
            raise OptionsError("layer 0 cannot be skipped (the cache length and the mask are read from it); drop 0 from skip_layers")
        if self.draft_model is not None and self.drafter != "draft-model":
            raise OptionsError(f"draft_model only applies to drafter 'draft-model' (got drafter '{self.drafter}')")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["skip_layers"] = list(self.skip_layers) if self.skip_layers is not None else None
        return data


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OptionsError(f"unknown {name} {value!r}; choose one of: {', '.join(allowed)}")


def _int_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise OptionsError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
