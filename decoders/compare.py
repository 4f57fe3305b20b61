"""A run against its baseline: the first token where they differ, and whether that is rounding or a real mismatch.

Why a difference can be rounding. Greedy speculative decoding is exact as an algorithm: it keeps a draft only if it
is the target's argmax. But the target scores the drafts in one forward over several tokens, while the baseline
takes one-token steps, and the two sum in different orders. Their logits differ a little (SmolLM2: ~5e-5 in float32,
~0.5 in bfloat16); where the target's best two tokens are closer than that, the run can rank them the other way,
and from there the two texts go different, equally valid, ways.

How the first difference is judged (at output position i, the run chose a, the baseline b, on the same prefix):
1. Each side must have kept what its own forward ranked first (TokenRecord.top[0]); if not, its verifier or its
   commit took a token the target did not choose: a mismatch, whatever the numbers.
2. The position is re-scored exactly: one float64 forward of the same weights on the same prefix
   (decoders/rescore.py, layer by layer), giving the exact logits z. The exact margin z[b] - z[a] says which token
   the target really prefers, and by how much.
3. Each side's error is measured against z: the largest |logit - z| over a and b, from the logits it recorded
   (TokenRecord.top: its TOP_LOGITS best; a token below them is bounded by the last one kept).
4. The rounding this dtype makes at this very position is measured too (the noise): the largest |logit - z| over
   the exact row's 16 best tokens of one more forward in the run's dtype (a prefill of the prefix, a third
   summation order), computed the stock way and never with the model's own kernels, nor taken from either side's
   logits: a bug shared by every forward of the loaded model must not set its own tolerance (rescore.py).
   Calibration on SmolLM2 (greedy continuations of 5 prompts): a 5-token verification forward's error over the exact
   row's 16 best tokens was at most 3.5x (median 1.0x) the larger of a prefill's and a one-token step's, over 122
   positions in bfloat16, and 1.5x over 17 in float32; hence TOLERANCE = 6x the noise (headroom for wider trees
   and batched forwards), and at least a few units in the last place of the logits. So a bfloat16 forward must be
   off by about 1 logit (6 x ~0.15) before it is called a bug, a float32 one by about 3e-4. (That calibration
   took the larger of the loaded model's prefill and the baseline's steps as the noise; with the stock reference
   prefill alone, the SmolLM2 bfloat16 flips of tests/test_compare.py still all read rounding.)
- rounding: both sides' errors are within the tolerance, i.e. each forward was as close to the exact logits as
  rounding lets a correct forward be here, and the exact margin is within the errors they made on the two tokens
  (a flip of a gap wider than both forwards' errors is no rounding, whatever the tolerance says).
- mismatch: a forward that moved the two logits by more than rounding can (a wrong position, a stale cache
  entry, a verifier that accepted what the target did not choose), or an output that stops early without a stop
  reason ("prefix" that no cancellation or context limit explains).
At temperature > 0 a run follows its own random draws, so there is no token-for-token check ("sampled"): sampling's
losslessness is a statistical property (tests/test_equivalence.py runs a chi-square test).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .trace import Trace

TOLERANCE = 6.0  # an error up to this many times the measured noise is rounding (see the docstring, point 4)
ULPS = 4  # the tolerance's floor: this many units in the last place of the largest exact logit, in the run's dtype
EXPLAINED_STOPS = ("cancelled", "context")  # stop reasons that explain an output shorter than the other one


@dataclass(frozen=True)
class Comparison:
    same: bool | None  # None: not comparable token for token (sampling)
    kind: str  # "same" | "rounding" | "mismatch" | "sampled" | "prefix" | "unclassified" (no logits or no model)
    position: int | None = None  # first differing output position (0-based)
    baseline_token: int | None = None
    run_token: int | None = None
    exact_margin: float | None = None  # float64 logit of the baseline's token minus the run's (> 0: the baseline's)
    run_error: float | None = None  # the run's largest |logit - exact| over the two tokens
    baseline_error: float | None = None  # the baseline's, likewise
    noise: float | None = None  # what a correct forward in this dtype gets wrong at this position (measured)
    tolerance: float | None = None  # the largest error still called rounding (TOLERANCE x noise, or the ulp floor)
    dtype: str = ""
    reason: str = ""  # what decided the verdict, in words

    def line(self, texts: tuple[str, str] | None = None) -> str:
        """One line for the CLI and the Race: 'same as baseline' or 'differs at token N: rounding (...)'."""
        if self.kind == "same":
            return "same as baseline"
        if self.kind == "prefix":
            return f"same as baseline as far as both went ({self.reason})"
        if self.kind == "sampled":
            return "not compared token for token (temperature > 0: each run follows its own draws)"
        shown = f"; baseline {texts[0]!r}, this run {texts[1]!r}" if texts else ""
        where = f"differs at token {self.position + 1}" if self.position is not None else "differs"
        if self.kind == "rounding":
            return f"{where}: rounding ({self.reason}{shown})"
        if self.kind == "unclassified":
            return f"{where} ({self.reason}{shown})"
        return f"{where}: mismatch ({self.reason}{shown})"

    def to_dict(self) -> dict:
        return asdict(self)


def compare(run: Trace, baseline: Trace, model: torch.nn.Module | None = None) -> Comparison:
    """Compare a finished run with the baseline's run on the same prompt, model and dtype. `model` is the target
    both ran on: needed only where they differ, to re-score that position in float64 (without it: "unclassified")."""
    dtype = str((run.models.get("target") or {}).get("dtype", ""))
    if _temperature(run) > 0 or _temperature(baseline) > 0:
        return Comparison(None, "sampled", dtype=dtype)
    ours, theirs = run.output_ids, baseline.output_ids
    position = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if position is None:
        return Comparison(True, "same", dtype=dtype) if len(ours) == len(theirs) else _prefix(run, baseline, dtype)
    found = dict(position=position, baseline_token=theirs[position], run_token=ours[position], dtype=dtype)
    run_top, base_top = _top(run, position), _top(baseline, position)
    if not run_top or not base_top:
        return Comparison(False, "unclassified", **found, reason="no logits recorded to tell rounding from a bug")
    if run_top[0][0] != ours[position] or base_top[0][0] != theirs[position]:  # no re-score needed to tell
        return classify(position, run_top, base_top, ours[position], theirs[position], {}, 0.0, dtype)
    if model is None:
        return Comparison(False, "unclassified", **found, reason="no model at hand to re-score the position exactly")
    from .rescore import rescore

    ids = {token for token, _ in run_top + base_top} | {ours[position], theirs[position]}
    exact = rescore(model, list(run.prompt_ids) + ours[:position], sorted(ids))
    return classify(position, run_top, base_top, ours[position], theirs[position], exact.exact, exact.noise, dtype)


def classify(position: int, run_top: list, base_top: list, run_token: int, base_token: int,
             exact: dict[int, float], noise: float, dtype: str) -> Comparison:
    """The verdict at a first difference, from both sides' recorded [id, logit] lists (best first), the exact
    (float64) logits of at least those tokens, and the noise a correct forward in `dtype` makes there."""
    found = dict(position=position, baseline_token=base_token, run_token=run_token, dtype=dtype)
    if run_top[0][0] != run_token:
        return Comparison(False, "mismatch", **found, reason="this run kept a token its own verifying forward did "
                          f"not rank first (it ranked token {run_top[0][0]} first)")
    if base_top[0][0] != base_token:
        return Comparison(False, "mismatch", **found, reason="the baseline kept a token its own forward did not rank "
                          f"first (it ranked token {base_top[0][0]} first)")
    pair = (run_token, base_token)
    run_error = _error(run_top, exact, pair)
    base_error = _error(base_top, exact, pair)
    tolerance = max(TOLERANCE * noise, _ulp_floor(exact, dtype))
    margin = exact[base_token] - exact[run_token]
    found.update(exact_margin=margin, run_error=run_error, baseline_error=base_error, noise=noise,
                 tolerance=tolerance)
    if run_error > tolerance:
        return Comparison(False, "mismatch", **found, reason=f"this run's logits for the two tokens are {_g(run_error)}"
                          f" off the exact ones, more than {dtype} rounding makes here (a correct forward: "
                          f"{_g(noise)}; allowed {_g(tolerance)})")
    if base_error > tolerance:
        return Comparison(False, "mismatch", **found, reason=f"the baseline's logits for the two tokens are "
                          f"{_g(base_error)} off the exact ones, more than {dtype} rounding makes here (a correct "
                          f"forward: {_g(noise)}; allowed {_g(tolerance)})")
    spread = _spread(run_top, exact, pair) + _spread(base_top, exact, pair)
    if abs(margin) > spread:
        return Comparison(False, "mismatch", **found, reason=f"in exact (float64) arithmetic the target prefers "
                          f"{'the baseline' if margin > 0 else 'this run'}'s token by {_g(abs(margin))}, more than the "
                          f"two forwards' errors on the two tokens add up to ({_g(spread)}): rounding cannot flip it")
    prefers = "the baseline's" if margin > 0 else "this run's" if margin < 0 else "neither"
    return Comparison(False, "rounding", **found, reason=f"a near-tie: in exact (float64) arithmetic the target "
                      f"prefers {prefers} token by only {_g(abs(margin))}, and the two forwards were off by "
                      f"{_g(run_error)} (this run) and {_g(base_error)} (the baseline), both within {dtype} rounding "
                      f"here (a correct forward: {_g(noise)} off)")


def _prefix(run: Trace, baseline: Trace, dtype: str) -> Comparison:
    """One output is a strict prefix of the other: fine only where the shorter run says why it stopped early."""
    shorter, who = (run, "this run") if len(run.output_ids) < len(baseline.output_ids) else (baseline, "the baseline")
    n, longer = len(shorter.output_ids), max(len(run.output_ids), len(baseline.output_ids))
    if shorter.stop_reason in EXPLAINED_STOPS:
        return Comparison(True, "prefix", position=n, dtype=dtype,
                          reason=f"{who} stopped after {n} tokens: {shorter.stop_reason}")
    return Comparison(False, "mismatch", position=n, dtype=dtype,
                      reason=f"{who} stopped after {n} tokens (stop reason {shorter.stop_reason or 'none'}) where "
                             f"the other went on to {longer}: the same tokens should end at the same place")


def _top(trace: Trace, position: int) -> list | None:
    return trace.tokens[position].top if position < len(trace.tokens) else None


def _error(top: list, exact: dict[int, float], tokens) -> float:
    """The largest |recorded logit - exact| over `tokens`; a token below the recorded list counts with the least
    error it can have (its logit is at most the last one kept)."""
    logits = dict((int(t), float(v)) for t, v in top)
    floor = min(logits.values())
    errors = [abs(logits[t] - exact[t]) if t in logits else max(0.0, exact[t] - floor) for t in tokens]
    return max(errors, default=0.0)


def _spread(top: list, exact: dict[int, float], pair) -> float:
    """How far one side's recorded margin between the two tokens can be from the exact one: the sum of its errors on
    them (each, below the recorded list, the least it can be)."""
    return sum(_error(top, exact, [token]) for token in pair)


def _ulp_floor(exact: dict[int, float], dtype: str) -> float:
    """A few units in the last place of the largest exact logit: a noise sample of exactly 0 allows that much."""
    eps = torch.finfo(getattr(torch, dtype, torch.float32)).eps
    return ULPS * eps * max((abs(v) for v in exact.values()), default=1.0)


def _g(value: float) -> str:
    return f"{value:.3g}"


def _temperature(trace: Trace) -> float:
    return float((trace.options or {}).get("temperature", 0.0) or 0.0)
