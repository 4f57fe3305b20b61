"""A run against its baseline: the first token where they differ, and whether that is rounding or a real mismatch.

Why a difference can be rounding. Greedy speculative decoding is exact as an algorithm: it keeps a draft only if it
is the target's argmax. But the target scores the drafts in one forward over several tokens, while the baseline
takes one-token steps, and the two sum in different orders. Their logits differ a little (measured on SmolLM2 over
9 prompts x 24 tokens: up to 1.2e-4 in float32, up to 1.28 in bfloat16, logits up to ~48). Where the baseline's best
two tokens are closer than that, the verifying forward can rank them the other way, and from there the two texts go
different, equally valid, ways.

So a difference at output position i is classified from the logits both runs recorded (TokenRecord.top2):
- rounding: the baseline's top-2 gap at i is within what the number format resolves (RESOLUTION below), the run's
  token is the baseline's runner-up, and the run's own verifying forward ranked it first;
- mismatch: anything else (a gap the format resolves, a token that was not the runner-up, or a token its own
  verifying forward did not rank first): a real disagreement, i.e. a bug.
At temperature > 0 a run follows its own random draws, so there is no token-for-token check ("sampled"): sampling's
losslessness is a statistical property (tests/test_equivalence.py runs a chi-square test).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .trace import Trace

# Logit differences a number format cannot be trusted to resolve between a multi-token forward and one-token steps:
# 4x (float32) and 1.5x (bfloat16) the largest difference measured on SmolLM2 (see above); float16 has 3 more
# mantissa bits than bfloat16, so an eighth of bfloat16's.
RESOLUTION = {"float32": 5e-4, "bfloat16": 2.0, "float16": 0.25}


@dataclass(frozen=True)
class Comparison:
    same: bool | None  # None: not comparable token for token (sampling)
    kind: str  # "same" | "rounding" | "mismatch" | "sampled" | "prefix" | "unclassified" (an old trace: no logits)
    position: int | None = None  # first differing output position (0-based)
    baseline_token: int | None = None
    run_token: int | None = None
    gap: float | None = None  # the baseline's top-2 logit gap at that position
    run_gap: float | None = None  # the run's own top-2 gap there (its verifying forward)
    resolution: float | None = None  # RESOLUTION of the run's dtype
    dtype: str = ""
    reason: str = ""  # for a mismatch: which condition failed

    def line(self, texts: tuple[str, str] | None = None) -> str:
        """One line for the CLI and the Race: 'same as baseline' or 'differs at token N: rounding (...)'."""
        if self.kind == "same":
            return "same as baseline"
        if self.kind == "prefix":
            return "same as baseline as far as both went"
        if self.kind == "sampled":
            return "not compared token for token (temperature > 0: each run follows its own draws)"
        shown = f"; baseline {texts[0]!r}, this run {texts[1]!r}" if texts else ""
        if self.kind == "rounding":
            return (f"differs at token {self.position + 1}: rounding (baseline's top-2 gap {self.gap:.3g} is within "
                    f"{self.dtype}'s ~{self.resolution:g}; the verifying forward ranked them the other way{shown})")
        if self.kind == "unclassified":
            return f"differs at token {self.position + 1} ({self.reason}{shown})"
        return f"differs at token {self.position + 1}: mismatch ({self.reason}{shown})"

    def to_dict(self) -> dict:
        return asdict(self)


def compare(run: Trace, baseline: Trace) -> Comparison:
    """Compare a finished run with the baseline's run on the same prompt, model and dtype."""
    dtype = str((run.models.get("target") or {}).get("dtype", ""))
    if _temperature(run) > 0 or _temperature(baseline) > 0:
        return Comparison(None, "sampled", dtype=dtype)
    ours, theirs = run.output_ids, baseline.output_ids
    position = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if position is None:
        return Comparison(True, "same" if len(ours) == len(theirs) else "prefix", dtype=dtype)
    return _classify(position, run.tokens[position].top2 if position < len(run.tokens) else None,
                     baseline.tokens[position].top2 if position < len(baseline.tokens) else None,
                     ours[position], theirs[position], dtype)


def _classify(position: int, run_top2, base_top2, run_token: int, base_token: int, dtype: str) -> Comparison:
    resolution = RESOLUTION.get(dtype, RESOLUTION["float32"])
    found = dict(position=position, baseline_token=base_token, run_token=run_token, resolution=resolution, dtype=dtype)
    if not base_top2 or not run_top2:  # a trace from before TokenRecord.top2 existed
        return Comparison(False, "unclassified", **found, reason="no logits recorded to tell rounding from a bug")
    (best, best_logit), (second, second_logit) = base_top2
    gap = best_logit - second_logit
    (run_best, run_best_logit), (run_second, run_second_logit) = run_top2
    run_gap = run_best_logit - run_second_logit if run_second == base_token else None
    found.update(gap=gap, run_gap=run_gap)
    if run_best != run_token:
        reason = "this run kept a token its own verifying forward did not rank first"
    elif second != run_token:
        reason = "this run's token was not even the baseline's second choice"
    elif gap > resolution:
        reason = f"the baseline's top-2 gap {gap:.3g} is wider than {dtype} rounding (~{resolution:g})"
    elif run_gap is not None and run_gap > resolution:
        reason = f"the verifying forward's top-2 gap {run_gap:.3g} is wider than {dtype} rounding (~{resolution:g})"
    else:
        return Comparison(False, "rounding", **found)
    return Comparison(False, "mismatch", **found, reason=reason)


def _temperature(trace: Trace) -> float:
    return float((trace.options or {}).get("temperature", 0.0) or 0.0)
