"""Greedy chains kept on the device (issue 46): draft model, layer skip, early exit and prophet read once a round.

decoders/drafters/base._chain_on_device feeds each argmax back as a device tensor and brings the tokens, their q and
the draft-length rule's measures (rules.DraftRule.measure) back in one copy, where the rule's verdicts are decided in
order. On an accelerator the steps run to the limit and positions past the first stop are dropped when read; on the
CPU (device_tree.STOPS_READ_ON) the measures are read at each check and drafting stops there. Either way the tree,
the checks the trace records, the stop reason and the greedy output equal the host chain's.
"""
from __future__ import annotations

import pytest
import torch
from baselines import baseline_ids
from host_reads import HostReads, reads
from tree_helpers import PROMPTS

from decoders.controller import CostAwareRule
from decoders.drafters.base import DraftStop, draft_chain
from decoders.rules import AdaEDLRule, LambdaSchedule, MaxConfidenceRule, StaticRule
from decoders.sampling import Warp

V = 12
ON_THE_DEVICE = frozenset()  # STOPS_READ_ON as on a GPU: no read at a check
AT_THE_CHECK = frozenset({"cpu"})  # as on the CPU: read at each check, stop there


def _rules() -> dict:
    """Rules that judge q (their stops land inside a chain of 6) and one that never does."""
    return {
        "adaedl": lambda: AdaEDLRule(LambdaSchedule(0.35, 6)),
        "max-confidence": lambda: MaxConfidenceRule(LambdaSchedule(0.45, 6)),
        "controller": lambda: _controller(extend=False),
        "controller past its cap": lambda: _controller(extend=True),
        "static": lambda: StaticRule(6),
    }


def _controller(extend: bool) -> CostAwareRule:
    rule = CostAwareRule(AdaEDLRule(LambdaSchedule(0.35, 6)), t=lambda n: 1.0 + 0.4 * (n - 1), c=0.05, max_cap=6,
                         extend=extend)
    rule.limit()  # the round's plan: a cap, and past it (extend) drafting on while it pays
    return rule


def _table(seed: int) -> torch.Tensor:
    """(V, V) next-token logits by the last token: integer logits, so ties and flat rows (stops) are common."""
    return torch.randint(0, 4, (V, V), generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("stops_read_on", [ON_THE_DEVICE, AT_THE_CHECK])
@pytest.mark.parametrize("record", [True, False])
def test_a_judged_greedy_chain_on_the_device_equals_the_host_chain(stops_read_on, record, monkeypatch):
    from decoders.drafters import device_tree

    monkeypatch.setattr(device_tree, "STOPS_READ_ON", stops_read_on)
    stopped = extending = 0
    for seed in range(12):
        table = _table(seed)
        for name, make in _rules().items():
            for first in range(0, V, 3):
                step = lambda tokens: table[torch.as_tensor(tokens)[-1]]  # (V,) from the last token only
                host = draft_chain(step, [first], 6, make(), Warp(0.0), torch.Generator(), record)
                counter, rule = HostReads(), make()
                with counter.active():
                    device = draft_chain(step, [first], 6, rule, Warp(0.0), torch.Generator(), record, tensors=True)
                case = (seed, name, first)
                assert (device.tree.tokens, device.tree.parents, device.tree.q_token) == \
                       (host.tree.tokens, host.tree.parents, host.tree.q_token), case
                assert (device.checks, device.reason) == (host.checks, host.reason), case
                past_cap = sum(rule.reads_at(position) for position in range(1, 7))  # checks the controller reads
                extending += past_cap > 0
                if stops_read_on or host.reason != DraftStop.RULE:
                    assert device.forwards == host.forwards, case  # stopped at the check, as the host chain
                elif past_cap:
                    assert host.forwards <= device.forwards <= 6, case  # on to the first check that reads at most
                else:
                    assert device.forwards == 6, case  # ran to the limit, the stop found in the one read
                if not stops_read_on or name == "static":
                    assert reads(counter.take()) <= 1 + past_cap, case  # the one read at the end (and past the cap)
                stopped += host.reason == DraftStop.RULE
    assert stopped > 20 and extending > 0  # the rules stopped chains; a controller round read at each check


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_sampled_chain_on_the_device_draws_what_the_host_chain_draws(temperature, monkeypatch):
    """At the check (the CPU) a sampled device chain makes the host chain's multinomial calls in the same order:
    the same drafts, q rows, checks and stops from the same seed, and one read; on an accelerator it draws on past a
    stop (later draws shift), the kept drafts still those of the same positions."""
    from decoders.drafters import device_tree

    warp = Warp(temperature)
    for seed in range(8):
        table = _table(seed)
        step = lambda tokens: table[torch.as_tensor(tokens)[-1]]  # (V,)
        for name, make in _rules().items():
            monkeypatch.setattr(device_tree, "STOPS_READ_ON", AT_THE_CHECK)
            host = draft_chain(step, [seed % V], 6, make(), warp, torch.Generator().manual_seed(seed), True)
            counter, rule = HostReads(), make()
            with counter.active():
                device = draft_chain(step, [seed % V], 6, rule, warp, torch.Generator().manual_seed(seed), True,
                                     tensors=True)
            case = (seed, name)
            assert (device.tree.tokens, device.tree.q_token, device.checks, device.reason) == \
                   (host.tree.tokens, host.tree.q_token, host.checks, host.reason), case
            assert device.tree.q_dists.keys() == host.tree.q_dists.keys(), case
            assert all(torch.equal(device.tree.q_dists[i], host.tree.q_dists[i]) for i in host.tree.q_dists), case
            if rule.measure(torch.ones(V) / V) is None:  # nothing to read at a check, even here
                assert reads(counter.take()) == 1, case
            monkeypatch.setattr(device_tree, "STOPS_READ_ON", ON_THE_DEVICE)
            ahead = draft_chain(step, [seed % V], 6, make(), warp, torch.Generator().manual_seed(seed), True,
                                tensors=True)
            assert (ahead.tree.tokens, ahead.checks, ahead.reason) == (host.tree.tokens, host.checks, host.reason)


def test_a_rules_check_is_its_measure_then_its_decision():
    """check() = decide(measure(q) read): the split the device chain reads in one copy, the same records."""
    q = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0]), -1)
    for make in _rules().values():
        rule, twin = make(), make()
        measured = twin.measure(q)
        values = [] if measured is None else measured.tolist()
        for position in (1, 2, 3):
            assert rule.check(position, q) == twin.decide(position, values)


@pytest.fixture(scope="module")
def models():
    from tiny import noisy_copy, tiny_llama

    target = tiny_llama(seed=5, layers=4)
    torch.manual_seed(0)
    return {"target": target, "draft": noisy_copy(target, noise=0.05)}


def _chain_drafters(models) -> dict:
    from decoders.drafters import DraftModelDrafter, LayerSkipDrafter
    from decoders.drafters.early_exit import EarlyExitDrafter
    from decoders.drafters.prophet import ProphetDrafter
    from decoders.selfdraft.heads import ExitBlock, Prophet

    target, draft = models["target"].model, models["draft"].model
    torch.manual_seed(0)
    block, prophet = ExitBlock(target, 2), Prophet(target, 1)
    return {
        "draft-model": lambda runner: DraftModelDrafter(draft),
        "layer-skip": lambda runner: LayerSkipDrafter(runner, [1]),
        "early-exit": lambda runner: EarlyExitDrafter(runner, block),
        "prophet": lambda runner: ProphetDrafter(prophet, target.config.vocab_size),
    }


@pytest.mark.parametrize("rule", ["adaedl", "max-confidence", "controller"])
def test_chain_drafters_on_the_device_stay_exact_and_record_the_same_checks(models, rule, monkeypatch):
    """Each chain drafter with a judging rule, its steps run to the limit as on a GPU: the greedy output equals the
    baseline, and the trace's rounds (drafts, checks, stop reasons) equal those of a run stopped at each check."""
    from test_self_drafters import run_with

    from decoders.drafters import device_tree

    monkeypatch.setattr(CostAwareRule, "observe_time", lambda *args: None)  # c fixed: caps not timed, runs alike
    lm = models["target"]
    make = {"adaedl": lambda: AdaEDLRule(LambdaSchedule(0.4, 5)),
            "max-confidence": lambda: MaxConfidenceRule(LambdaSchedule(0.5, 5)),
            "controller": lambda: CostAwareRule(AdaEDLRule(LambdaSchedule(0.4, 5)), t=lambda n: 1.0, c=0.05,
                                                max_cap=5, extend=False)}[rule]
    stops = 0
    for name, drafter in _chain_drafters(models).items():
        for prompt in PROMPTS[:2]:
            traces = {}
            for where in (ON_THE_DEVICE, AT_THE_CHECK):
                monkeypatch.setattr(device_tree, "STOPS_READ_ON", where)
                traces[where] = run_with(drafter, lm, prompt, 24, make())
                assert traces[where].output_ids == baseline_ids(lm, prompt, 24), (name, rule, where)
            device, host = traces[ON_THE_DEVICE], traces[AT_THE_CHECK]
            assert [(r.n_drafted, r.n_accepted, [n.token for n in r.nodes], r.rule) for r in device.rounds] == \
                   [(r.n_drafted, r.n_accepted, [n.token for n in r.nodes], r.rule) for r in host.rounds], name
            stops += sum(r.draft_forwards > h.draft_forwards for r, h in zip(device.rounds, host.rounds))
    assert stops > 0  # some rounds stopped inside the limit, and the device runs drafted on past the stop


@pytest.mark.parametrize("name", ["draft model, AdaEDL", "layer skip", "early exit", "prophet"])
def test_chains_running_past_their_stop_on_fixed_buffers_stay_exact(name, monkeypatch, tmp_path):
    """As on a GPU (steps run to the limit, positions past the stop dropped when read) over fixed-shape buffers,
    greedy and sampled: greedy equals the baseline; sampled equals itself over two runs (the same draws)."""
    from dataclasses import replace

    from kv_helpers import PROMPTS as KV_PROMPTS
    from kv_helpers import drafter_pair, options_for

    from decoders import DecodeOptions, generate
    from decoders.drafters import device_tree

    monkeypatch.setattr(device_tree, "STOPS_READ_ON", ON_THE_DEVICE)
    pair = drafter_pair(tmp_path)
    options = replace(options_for(name, pair, kv_cache="fixed"), rule="adaedl", max_draft=5)
    ahead = 0
    for prompt in KV_PROMPTS.values():
        greedy = generate(options, prompt, target=pair["target"], draft=pair["draft"])
        ahead += sum(r.rule["reason"] == "rule" and r.draft_forwards == r.rule["limit"] for r in greedy.rounds)
        baseline = generate(DecodeOptions(max_new_tokens=options.max_new_tokens), prompt, target=pair["target"])
        assert greedy.output_ids == baseline.output_ids, name
        sampled = [generate(replace(options, temperature=1.0, seed=2), prompt, target=pair["target"],
                            draft=pair["draft"]).output_ids for _ in range(2)]
        assert sampled[0] == sampled[1], name
    assert ahead > 0  # rounds the rule stopped inside the limit while the steps ran on to it


def test_a_chain_that_draws_past_its_stop_still_samples_the_target(monkeypatch):
    """Lossless as on a GPU: the draft model draws every position up to the limit and the positions after AdaEDL's
    stop are dropped when read (their draws are spent, so later draws shift); the first two output tokens still
    follow the target's distribution (chi-square over every pair, as tests/test_self_drafters.py)."""
    from chi_square import chi_square_pvalue
    from test_self_drafters import run_with
    from tree_helpers import BOUND, PROMPT, VOCAB, exact_pairs, small_models

    from decoders.drafters import DraftModelDrafter, device_tree

    monkeypatch.setattr(device_tree, "STOPS_READ_ON", ON_THE_DEVICE)
    small = small_models()
    lm, draft = small["target"], small["noisy"].model
    counts, stops = torch.zeros(VOCAB, VOCAB), 0
    for seed in range(500):
        trace = run_with(lambda runner: DraftModelDrafter(draft), lm, PROMPT, 4, AdaEDLRule(LambdaSchedule(0.7, 3)),
                         Warp(1.0), seed=seed)  # 4 tokens: the first round may draft 3 (2 leave room for 1)
        counts[trace.output_ids[0], trace.output_ids[1]] += 1
        stops += trace.rounds[0].rule["reason"] == "rule"
    assert stops > 50  # the rule stopped inside the limit in many runs, drafts past it drawn and dropped
    pvalue = chi_square_pvalue(counts, exact_pairs(lm, Warp(1.0)))
    assert pvalue > BOUND, f"chi-square p = {pvalue:.2e}"
