"""Every difference from the baseline explained (decoders/compare.py): rounding in a low-precision run, a mismatch
for a verifier that accepts what the target did not choose."""
from __future__ import annotations

import copy

import pytest
import torch

from decoders import DecodeOptions, OptionsError, generate, loop
from decoders.compare import Comparison, classify, compare
from decoders.trace import TOP_LOGITS
from decoders.verify import Verdict

PROMPTS = [[7], [3, 9, 4, 1, 7, 22, 5], [10, 11, 12, 10, 11, 12, 10, 11]]
BF16_PROMPTS = PROMPTS + [[k % 64 for k in range(s, s + 9)] for s in range(0, 60, 6)]


def in_bfloat16(lm):
    from decoders.runtime import kernels

    half = copy.deepcopy(lm)
    kernels.unpack(half.model)  # a bench test may have packed the session's models; packed weights stay float32
    half.model = half.model.to(torch.bfloat16)
    half.dtype = torch.bfloat16
    return half


def _top(*pairs):
    return [[token, logit] for token, logit in pairs]


def test_a_bfloat16_three_way_tie_is_rounding():
    """Issue 33, the Race's copy task in bf16: the baseline's top two tie exactly (gap 0.0) and the run's token, one
    ulp (0.125) below them there, was not even the baseline's runner-up. The old classifier called it a bug."""
    a, b, c = 9, 4, 5  # the run's token, the baseline's, the baseline's runner-up
    base = _top((b, 20.0), (c, 20.0), (a, 19.875), (7, 18.5))
    run = _top((a, 20.0), (b, 19.875), (c, 19.875), (7, 18.625))
    exact = {a: 19.93, b: 19.96, c: 19.94, 7: 18.55}
    verdict = classify(0, run, base, a, b, exact, noise=0.1, dtype="bfloat16")
    assert verdict.kind == "rounding", verdict
    assert verdict.exact_margin == pytest.approx(0.03) and verdict.run_error == pytest.approx(0.085)
    assert "near-tie" in verdict.reason and "0.03" in verdict.reason


def test_the_skipped_gap_scenario_is_a_mismatch():
    """The review's case: the baseline nearly ties A and B (2e-4 apart); a buggy verifying forward moved the logits by
    2 to 4 and picked B with C as its runner-up. The old classifier skipped the run-side check (its runner-up was not
    A) and called it rounding."""
    A, B, C = 1, 2, 3
    base = _top((A, 10.0), (B, 9.9998), (C, 8.0))
    run = _top((B, 12.0), (C, 11.0), (A, 8.0))
    exact = {A: 10.00001, B: 9.99982, C: 8.00001}
    verdict = classify(5, run, base, B, A, exact, noise=2e-5, dtype="float32")
    assert verdict.kind == "mismatch" and verdict.run_error == pytest.approx(2.0, abs=1e-3)
    assert "off the exact ones" in verdict.reason


def test_a_token_below_the_recorded_list_counts_with_its_least_error():
    """The run never recorded the baseline's token: its logit is at most the last one kept, so its error is at
    least the exact logit minus that."""
    run = _top((9, 10.0), (3, 9.0))
    base = _top((4, 10.0), (9, 9.99))
    verdict = classify(0, run, base, 9, 4, {9: 9.995, 4: 10.0, 3: 7.0}, noise=1e-4, dtype="float32")
    assert verdict.kind == "mismatch" and verdict.run_error == pytest.approx(1.0)  # 10.0 - 9.0 at least


def test_a_kept_token_its_own_forward_did_not_rank_first_is_a_mismatch():
    verdict = classify(3, _top((4, 10.0), (9, 9.99)), _top((4, 10.0), (9, 9.9999)), 9, 4, {4: 10.0, 9: 9.9999},
                       noise=0.5, dtype="bfloat16")
    assert verdict.kind == "mismatch" and "did not rank first" in verdict.reason


def test_float32_tolerance_follows_the_measured_noise():
    base = _top((4, 10.0), (9, 10.0 - 1e-4))
    run = _top((9, 10.0), (4, 10.0 - 5e-5))
    exact = {4: 10.00003, 9: 9.99998}
    assert classify(0, run, base, 9, 4, exact, noise=3e-5, dtype="float32").kind == "rounding"
    moved = _top((9, 10.0), (4, 9.998))  # this run's logit for 4 is 2e-3 below the exact one: 60x the noise
    far = classify(0, moved, base, 9, 4, {4: 10.0, 9: 9.9999}, noise=3e-5, dtype="float32")
    assert far.kind == "mismatch" and far.run_error == pytest.approx(2e-3)


def _trace(ids, stop, temperature=0.0):
    from decoders import Trace
    from decoders.trace import TokenRecord

    return Trace(method="speculative", label="t", options={"temperature": temperature}, models={"target": {
        "dtype": "float32"}}, precision="", prompt="", prompt_ids=[1], output_ids=list(ids),
        tokens=[TokenRecord(t, "", "baseline", 0, _top((t, 1.0), (0, 0.0))) for t in ids], stop_reason=stop)


def test_an_early_stop_without_a_reason_is_a_mismatch():
    """Both runs share max_new_tokens, so a run that is a strict prefix of the other stopped where it should not."""
    baseline = _trace([5, 6, 7, 8], "max_new_tokens")
    short = compare(_trace([5, 6, 7], "max_new_tokens"), baseline)
    assert short.kind == "mismatch" and short.same is False and "stopped after 3 tokens" in short.reason
    cancelled = compare(_trace([5, 6, 7], "cancelled"), baseline)
    assert cancelled.kind == "prefix" and cancelled.same and "cancelled" in cancelled.line()


def test_lines_say_what_happened():
    assert Comparison(True, "same").line() == "same as baseline"
    rounding = Comparison(False, "rounding", 30, 4, 9, 0.01, 0.2, 0.1, 0.1, 0.4, "bfloat16", reason="a near-tie")
    assert rounding.line(("a", "b")) == "differs at token 31: rounding (a near-tie; baseline 'a', this run 'b')"
    mismatch = Comparison(False, "mismatch", 2, 4, 9, reason="r")
    assert mismatch.line() == "differs at token 3: mismatch (r)"


def test_float32_runs_are_the_same(tiny, drafts):
    for prompt in PROMPTS:
        trace = generate(DecodeOptions(method="speculative", gamma=4, max_new_tokens=40), prompt, target=tiny,
                         draft=drafts["noisy"], compare_baseline=True)
        assert trace.baseline_check["kind"] == "same", trace.baseline_check


def test_bfloat16_runs_that_diverge_are_rounding(tiny, drafts):
    """Tiny random models in bf16 tie often: many of these runs diverge, and every divergence, re-scored in float64,
    is rounding: both sides' logits within what a correct bf16 forward gets wrong there. The old classifier called
    some of them bugs (a three-way tie, where the run's token was not the baseline's runner-up)."""
    target, draft = in_bfloat16(tiny), in_bfloat16(drafts["noisy"])
    kinds = []
    for prompt in BF16_PROMPTS:
        trace = generate(DecodeOptions(method="speculative", gamma=4, max_new_tokens=60), prompt, target=target,
                         draft=draft, compare_baseline=True)
        check = trace.baseline_check
        kinds.append(check["kind"])
        if check["kind"] == "rounding":
            assert max(check["run_error"], check["baseline_error"]) <= check["tolerance"]
            assert abs(check["exact_margin"]) <= check["run_error"] + check["baseline_error"]
    assert kinds.count("rounding") >= 3 and "mismatch" not in kinds, kinds


def test_a_verifier_that_accepts_a_wrong_draft_is_a_mismatch(tiny, drafts, monkeypatch):
    """The negative control: accept the first draft whatever the target says."""
    real = loop.verify

    def careless(tree, logits, p, generator, argmax=None):
        verdict = real(tree, logits, p, generator, argmax)
        if tree.n_drafted and not verdict.path:
            return Verdict([1], int(logits[1].argmax()), verdict.source, verdict.checks)
        return verdict

    monkeypatch.setattr(loop, "verify", careless)
    trace = generate(DecodeOptions(method="speculative", gamma=3, max_new_tokens=40), PROMPTS[1], target=tiny,
                     draft=drafts["unrelated"], compare_baseline=True)
    assert trace.baseline_check["kind"] == "mismatch", trace.baseline_check
    assert "did not rank first" in trace.baseline_check["reason"]


def test_a_verification_forward_at_wrong_positions_is_a_mismatch_with_its_numbers(tiny, drafts, monkeypatch):
    """A bug that moves the logits (verification forwards at positions 3 too far) keeps the run's own top token, so
    only the exact re-score can tell: the run's logits are far more off than a float32 forward is."""
    from decoders.runtime.runner import CachedModel

    honest = CachedModel.forward_tree

    def shifted(self, tree, hidden=False):
        if tree.size == 1:
            return honest(self, tree, hidden)
        model = self.model
        original = model.forward

        def forward(*args, position_ids=None, **kwargs):
            return original(*args, position_ids=position_ids + 3, **kwargs)

        model.forward = forward
        try:
            return honest(self, tree, hidden)
        finally:
            del model.forward

    monkeypatch.setattr(CachedModel, "forward_tree", shifted)
    trace = generate(DecodeOptions(method="speculative", gamma=3, max_new_tokens=40), PROMPTS[1], target=tiny,
                     draft=drafts["same"], compare_baseline=True)
    check = trace.baseline_check
    assert check["kind"] == "mismatch", check
    assert check["run_error"] > 100 * check["noise"] and "off the exact ones" in check["reason"]


def test_sampled_runs_are_not_compared_token_for_token(tiny, drafts):
    trace = generate(DecodeOptions(method="speculative", temperature=1.0, max_new_tokens=8), PROMPTS[0], target=tiny,
                     draft=drafts["noisy"], compare_baseline=True)
    assert trace.baseline_check["kind"] == "sampled" and trace.baseline_check["same"] is None


def test_beam_methods_have_no_baseline_check(tiny):
    with pytest.raises(OptionsError, match="no token-for-token baseline check"):
        generate(DecodeOptions(method="beam-search", width=2, max_new_tokens=4), PROMPTS[0], target=tiny,
                 compare_baseline=True)


def test_the_record_survives_json(tiny, drafts):
    from decoders import Trace

    trace = generate(DecodeOptions(method="speculative", max_new_tokens=6, record=False), PROMPTS[1], target=tiny,
                     draft=drafts["noisy"], compare_baseline=True)
    back = Trace.from_json(trace.to_json())
    assert back.baseline_check == trace.baseline_check and back.tokens[0].top == trace.tokens[0].top
    assert len(trace.tokens[0].top) == TOP_LOGITS and compare(back, back).kind == "same"
    old = trace.to_dict()
    for token in old["tokens"]:  # a trace saved before TOP_LOGITS: two pairs, under "top2"
        token["top2"] = token.pop("top")[:2]
    assert Trace.from_dict(old).tokens[0].top == trace.tokens[0].top[:2]


HELD_OUT = "Describe how a bicycle gear works to a ten-year-old, in four short sentences."


@pytest.mark.slow
def test_smollm2_bfloat16_flips_read_rounding_with_their_numbers():
    """Issue 33's held-out case on the real model: bf16 prompt lookup and layer skip (40 tokens) left the baseline
    at token 27 (' wheels' for ' a'), and the old classifier called both a bug. Re-scored in float64 the target
    prefers ' wheels' by 0.08 and the baseline's own one-token step was the one that flipped (this CPU, AVX2 bf16).
    Another CPU may round differently and not diverge at all; it must never read "mismatch"."""
    from decoders.runtime.models import load_model

    lm = load_model("smollm2-135m", dtype="bfloat16")
    for drafter in ("prompt-lookup", "layer-skip"):
        trace = generate(DecodeOptions(model="smollm2-135m", dtype="bfloat16", method="speculative", drafter=drafter,
                                       max_new_tokens=40), HELD_OUT, target=lm, compare_baseline=True)
        check = trace.baseline_check
        assert check["kind"] in ("same", "rounding"), check
        if check["kind"] == "rounding":
            assert max(check["run_error"], check["baseline_error"]) <= check["tolerance"]


def test_the_race_stores_the_verdict_where_the_model_is_and_the_table_renders_it(tiny, drafts, monkeypatch):
    """The Race's run code (app/tabs/race/runs.py) holds the target, so it re-scores there and stores the verdict in
    the trace; the table's cell only reads it (compare is never called from the figure)."""
    from dataclasses import replace

    from app.figures import race as figure
    from app.tabs.race import runs
    from decoders import Trace

    target, draft = in_bfloat16(tiny), in_bfloat16(drafts["noisy"])
    monkeypatch.setattr(runs, "load_models", lambda options: (target, draft))
    base = DecodeOptions(max_new_tokens=60, record=False)
    raced = [base.to_dict(), replace(base, method="speculative", gamma=4).to_dict()]
    baseline, run = (Trace.from_dict(data) for data in runs._timed_runs(raced, "abcdefgh")
                     if "running" not in data)  # diverges in bf16; ticks left out
    check = run.baseline_check
    assert baseline.baseline_check is None and check["kind"] == "rounding", check
    monkeypatch.setattr("decoders.compare.compare", lambda *a, **k: pytest.fail("the figure re-computed the verdict"))
    text, hover, css = figure.same_cell(figure.race_row(run, baseline))
    assert text.startswith(f"no: rounding at token {check['position'] + 1}") and css == "sl-rounding"
    assert f"{check['exact_margin']:.3g}" in hover and f"{check['run_error']:.3g}" in hover


@pytest.mark.parametrize("form", ["packed", "bfloat16", "int8"])
def test_the_exact_rescore_is_a_float64_forward_of_the_same_weights(form):
    """decoders/rescore.py runs one layer at a time in float64 without touching the model: it must equal the whole
    model cast to float64 (packed weights read back dense, int8 ones dequantized), and leave the model as it was."""
    from decoders.runtime import kernels
    from decoders.rescore import exact_logits, rescore
    from tiny import tiny_qwen2

    lm = tiny_qwen2(seed=3, layers=3)
    reference = copy.deepcopy(lm.model)
    if form == "packed":
        kernels.pack(lm.model)
    elif form == "bfloat16":
        lm.model = lm.model.to(torch.bfloat16)
        reference = copy.deepcopy(lm.model)  # the bf16-rounded weights are the model now
    else:
        kernels.quantize_int8(lm.model)
        reference = _dequantized(copy.deepcopy(reference), lm.model)
    prefix = [3, 9, 4, 1, 7, 22, 5, 5]
    before = lm.model(torch.tensor([prefix])).logits[0, -1].detach()
    exact = exact_logits(lm.model, prefix)
    with torch.no_grad():
        expected = _float64_norms(reference.double())(torch.tensor([prefix])).logits[0, -1]
    assert exact.dtype == torch.float64 and torch.allclose(exact, expected, atol=1e-10, rtol=0)
    assert torch.equal(lm.model(torch.tensor([prefix])).logits[0, -1].detach(), before)  # the model is untouched
    scored = rescore(lm.model, prefix, [0, 1])
    assert {0, 1} <= set(scored.exact) and scored.noise >= 0 and scored.dtype == str(
        next(lm.model.parameters()).dtype).removeprefix("torch.")


class _Float64Norm(torch.nn.Module):
    """w * x / rms(x), all in float64: transformers' RMSNorm casts its input to float32 whatever it is."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return self.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _float64_norms(model):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RMSNorm"):
                setattr(parent, name, _Float64Norm(child))
    return model


def _dequantized(reference, quantized):
    """The float model with each linear's weight replaced by the int8 one it was quantized to."""
    from decoders.runtime import kernels

    int8 = {name: kernels.int8_weight(m) for name, m in quantized.named_modules() if kernels.is_int8(m)}
    with torch.no_grad():
        for name, module in reference.named_modules():
            if name in int8:
                module.weight.copy_(int8[name])
    return reference


def test_a_baseline_that_commits_a_token_its_forward_did_not_rank_first_is_a_mismatch(tiny, drafts, monkeypatch):
    """A baseline-side commit bug: at its 4th step the baseline keeps its runner-up. The run is right, both forwards
    are as exact as float32 gets, so only the baseline's own ranking can tell; the old classifier called it
    rounding."""
    from decoders import api

    state = {"baseline": False, "steps": 0}
    real_generate, real_verify = api.generate, loop.verify

    def generate_marking_the_baseline(options, *args, **kwargs):
        state["baseline"] = options.method == "baseline"
        try:
            return real_generate(options, *args, **kwargs)
        finally:
            state["baseline"] = False

    def verify(tree, logits, p, generator, argmax=None):
        verdict = real_verify(tree, logits, p, generator, argmax)
        if state["baseline"]:
            state["steps"] += 1
            if state["steps"] == 4:
                return Verdict(verdict.path, int(logits[0].topk(2).indices[1]), verdict.source, verdict.checks)
        return verdict

    monkeypatch.setattr(api, "generate", generate_marking_the_baseline)
    monkeypatch.setattr(loop, "verify", verify)
    trace = api.generate(DecodeOptions(method="speculative", gamma=3, max_new_tokens=20), PROMPTS[1], target=tiny,
                         draft=drafts["noisy"], compare_baseline=True)
    check = trace.baseline_check
    assert check["kind"] == "mismatch" and check["position"] == 3, check
    assert "the baseline kept a token its own forward did not rank first" in check["reason"]


def _with_scaled_norms(model):
    from decoders.runtime import fused

    class Scaled(fused.FusedRMSNorm):
        def forward(self, x):
            return torch.nn.functional.rms_norm(x, self.weight.shape, self.weight * (1 + 1e-3), self.eps)

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RMSNorm"):
                setattr(parent, name, Scaled(child))
    return model


def _near_tie(model, prefix, gap):
    """Make the model's (as loaded) second-best token trail its best by about `gap` at the end of `prefix`, by moving
    that token's LM-head row along the last hidden state; returns the logits after, (V,)."""
    with torch.no_grad():
        hidden = model.model(torch.tensor([prefix])).last_hidden_state[0, -1]  # (d,)
        logits = model.lm_head(hidden)
        a, b = logits.topk(2).indices.tolist()
        model.lm_head.weight[b] += (logits[a] - logits[b] - gap) * hidden / hidden.dot(hidden)
        return model(torch.tensor([prefix])).logits[0, -1]


def _verdict_on_a_near_tie(model, prefix):
    """The run's forward ranks the tie one way, the baseline's (another summation order) the other way by as much
    as float32 rounds here; the verdict on that difference, and the noise it was judged by."""
    from decoders.rescore import rescore

    clean_noise = rescore(model, prefix, [0]).noise
    logits = _near_tie(model, prefix, gap=clean_noise)
    order = logits.topk(TOP_LOGITS)
    run = [[int(t), float(v)] for t, v in zip(order.indices, order.values)]
    a, b = run[0][0], run[1][0]
    gap = run[0][1] - run[1][1]
    base = [[t, v + 2 * gap + clean_noise if t == b else v] for t, v in run]
    base.sort(key=lambda pair: -pair[1])
    scored = rescore(model, prefix, [a, b])
    return classify(7, run, base, a, b, scored.exact, scored.noise, "float32")


def test_a_norm_kernel_off_by_a_thousandth_in_every_forward_is_a_mismatch():
    """Issue 47: the noise used to be a forward of the model as loaded, so a bug in every forward (here a fused
    RMSNorm whose weight is scaled by 1+1e-3) set its own tolerance and a flip it caused read "rounding". The
    control: the same near-tie on the correct model is rounding."""
    from tiny import tiny_qwen2

    prefix = [3, 9, 4, 1, 7, 22, 5, 5]
    control = _verdict_on_a_near_tie(tiny_qwen2(seed=3, layers=3).model, prefix)
    assert control.kind == "rounding", control
    buggy = _verdict_on_a_near_tie(_with_scaled_norms(tiny_qwen2(seed=3, layers=3).model), prefix)
    assert buggy.kind == "mismatch" and "off the exact ones" in buggy.reason, buggy
    assert buggy.noise == pytest.approx(control.noise, rel=0.5)  # the bug did not move the measured noise


def test_the_referee_and_the_noise_never_run_the_models_own_kernels():
    """A fused stand-in's bug is in every forward of the loaded model; the float64 referee and the noise are the
    stock computation on the same weights, so they do not move with it."""
    from decoders.rescore import rescore
    from tiny import tiny_qwen2

    prefix = [3, 9, 4, 1, 7, 22, 5, 5]
    clean = rescore(tiny_qwen2(seed=3, layers=3).model, prefix, [0, 1])
    buggy_model = _with_scaled_norms(tiny_qwen2(seed=3, layers=3).model)
    buggy = rescore(buggy_model, prefix, [0, 1])
    assert buggy.exact == clean.exact and buggy.noise == clean.noise
    with torch.no_grad():
        off = buggy_model(torch.tensor([prefix])).logits[0, -1].double()
    worst = max(abs(float(off[t]) - v) for t, v in buggy.exact.items())
    assert worst > 100 * buggy.noise  # the loaded model's forward is far more off than a correct one


def test_a_flip_wider_than_both_sides_errors_is_a_mismatch():
    """Recorded logits that cannot explain the flip (the baseline's list puts b first with a logit below a's, both
    exact): every error is within the tolerance, yet the exact margin is wider than the errors add up to."""
    a, b = 9, 4
    run = _top((a, 10.0), (b, 9.9995))
    base = _top((b, 9.9995), (a, 10.0))
    exact = {a: 10.0, b: 9.9995}
    verdict = classify(0, run, base, a, b, exact, noise=1e-4, dtype="float32")
    assert verdict.kind == "mismatch" and "rounding cannot flip it" in verdict.reason, verdict
