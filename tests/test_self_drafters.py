"""Learned self-drafters (issue 26): early exit over the target's shared first layers, and the prophet decoder.

Lossless: greedy output equals the baseline token for token; sampled output follows the target (chi-square, with a
mutated residual as the negative control). Early exit: verification really skips the shared layers. Prophet:
drafts from the target's real last hidden state. Plus the save/load format, the registry, and the training loop.
"""
from __future__ import annotations

import pytest
import torch
from baselines import baseline_ids
from chi_square import chi_square_pvalue
from tree_helpers import BOUND, PROMPT, PROMPTS, VOCAB, exact_pairs, small_models

from decoders import DecodeOptions, OptionsError, generate
from decoders import verify as core
from decoders.rules import AdaEDLRule, LambdaSchedule, StaticRule
from decoders.sampling import Warp
from decoders.selfdraft.heads import ExitBlock, Prophet

LENGTHS = [1, 9, 30]
RUNS = 500


def run_with(drafter, lm, prompt, length, rule=None, warp=None, seed=0):
    from decoders import api
    from decoders.loop import run_rounds
    from decoders.recorder import TraceBuilder
    from decoders.runtime.runner import CachedModel

    options = DecodeOptions(method="speculative", max_new_tokens=length)
    builder = TraceBuilder(api._new_trace(options, lm, None, "", prompt), lm.decode, True)
    runner = CachedModel(lm.model)
    if callable(drafter):
        drafter = drafter(runner)
    trace = None
    for trace in run_rounds(runner, drafter, rule or StaticRule(4), warp or Warp(0.0), prompt, length,
                            set(lm.eos_token_ids), torch.Generator().manual_seed(seed), builder):
        pass
    return trace


@pytest.fixture(scope="module")
def four_layers():
    from tiny import tiny_llama, tiny_qwen2

    return {"llama": tiny_llama(seed=5, layers=4), "qwen2": tiny_qwen2(seed=6, layers=4)}


def _early_exit(lm, k, vocab_ids=None, noise=0.0):
    from decoders.drafters.early_exit import EarlyExitDrafter

    block = ExitBlock(lm.model, k, vocab_ids=vocab_ids)
    if noise:  # on a 2-layer target the copied block would make q = p: no rejection to test
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in block.layers.parameters():
                p.add_(noise * torch.randn(p.shape, generator=g))
    return lambda runner: EarlyExitDrafter(runner, block)


def _prophet(lm, layers=1, vocab_ids=None, noise=0.0):
    from decoders.drafters.prophet import ProphetDrafter

    torch.manual_seed(0)
    model = Prophet(lm.model, layers, vocab_ids=vocab_ids)
    with torch.no_grad():
        for p in model.parameters():  # noise: a draft far enough from the target that rejections happen
            p.add_(noise * torch.randn_like(p))
    return lambda runner: ProphetDrafter(model, lm.model.config.vocab_size)


def _rules():
    return {"static γ=4": lambda: StaticRule(4), "AdaEDL": lambda: AdaEDLRule(LambdaSchedule(0.5, 6))}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("rule", list(_rules()))
def test_early_exit_greedy_equals_baseline(four_layers, family, k, rule):
    lm = four_layers[family]
    for vocab_ids in (None, torch.arange(0, 64, 2)):  # full and reduced draft vocabulary
        for prompt in PROMPTS:
            for length in LENGTHS:
                trace = run_with(_early_exit(lm, k, vocab_ids), lm, prompt, length, _rules()[rule]())
                assert trace.output_ids == baseline_ids(lm, prompt, length), (family, k, rule, prompt, length)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_early_exit_greedy_equals_baseline_when_drafts_are_rejected(four_layers, family):
    """At k = 3 of 4 layers the block copies layer 3 and the target's norm, so q = p and nothing is ever rejected:
    the rollback of rejected drafts' stem entries (layers 1..k, written while drafting) would go untested. A noisy
    block drafts differently from the target: some rounds accept part of their drafts, and output stays equal.
    (Leaving the stem layers out of the rollback fails this test, not the one above: mutation checked.)"""
    lm = four_layers[family]
    partial = 0
    for prompt in PROMPTS:
        for length in LENGTHS:
            trace = run_with(_early_exit(lm, 3, noise=0.2), lm, prompt, length, StaticRule(4))
            assert trace.output_ids == baseline_ids(lm, prompt, length), (family, prompt, length)
            partial += sum(1 for r in trace.rounds if r.n_accepted < r.n_drafted)
    assert partial > 0  # drafts were rejected: the rollback ran


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("layers", [1, 2])
def test_prophet_greedy_equals_baseline(four_layers, family, layers):
    lm = four_layers[family]
    for vocab_ids in (None, torch.arange(0, 64, 3)):
        for prompt in PROMPTS:
            for length in LENGTHS:
                for rule in _rules().values():
                    trace = run_with(_prophet(lm, layers, vocab_ids), lm, prompt, length, rule())
                    assert trace.output_ids == baseline_ids(lm, prompt, length), (family, layers, prompt, length)


def _layer_tokens(model):
    """Count the tokens each decoder layer processes (forward hooks); returns (counts dict, remove())."""
    from decoders.runtime.runner import decoder_layers

    counts, handles = {}, []
    for i, layer in enumerate(decoder_layers(model)):
        def hook(module, args, kwargs, out, i=i):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            counts[i] = counts.get(i, 0) + hidden.shape[1]
        handles.append(layer.register_forward_hook(hook, with_kwargs=True))
    return counts, lambda: [h.remove() for h in handles]


def test_early_exit_verification_does_not_rerun_the_shared_layers(four_layers):
    """Each decoded node passes every target layer once: the draft's layers 0..k-1 are not repeated by
    verification (the default verification forward would run them a second time over every drafted token)."""
    from decoders.drafters.early_exit import EarlyExitDrafter

    lm = four_layers["llama"]
    prompt = PROMPTS[1]
    counts, remove = _layer_tokens(lm.model)
    made = []

    def build(runner):
        made.append(EarlyExitDrafter(runner, ExitBlock(lm.model, 2)))
        return made[-1]

    try:
        trace = run_with(build, lm, prompt, 30)
    finally:
        remove()
    prefill = len(prompt) - 1
    drafted = sum(r.n_drafted for r in trace.rounds)
    nodes = sum(1 + r.n_drafted for r in trace.rounds)
    assert drafted > 0
    assert counts[3] == prefill + nodes  # upper layers: prefill + one verification pass per node
    assert counts[0] == 2 * prefill + nodes  # lower: + start()'s stem over the prompt, never a second pass per node
    assert made[0].reused_layer_tokens > 0


def test_prophet_drafts_from_the_targets_last_hidden_state(four_layers):
    """Recompute every round's greedy chain from scratch (the target's last hidden state over the whole context,
    then the prophet without a cache) and compare: checks start, observe's feature choice and the round cache."""
    lm = four_layers["llama"]
    build = _prophet(lm, 2)
    drafter_box = []

    def make(runner):
        drafter_box.append(build(runner))
        return drafter_box[-1]

    trace = run_with(make, lm, PROMPTS[1], 24, StaticRule(3))
    prophet = drafter_box[0].model
    ids = list(PROMPTS[1])
    checked = 0
    for rnd in trace.rounds:
        drafted = [node.token for node in rnd.nodes[1:]]
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
            feature = out.hidden_states[-1][0, -1]  # (d,)
            chain, tokens = [], [ids[-1]]
            for _ in range(len(drafted)):
                first = prophet.first_input(feature[None], torch.tensor(tokens[:1]))  # (1, d)
                inputs = torch.cat([first, prophet.embed(torch.tensor(tokens[1:], dtype=torch.long))])[None]
                n = inputs.shape[1]
                from decoders.selfdraft.stem import causal_mask

                logits = prophet(inputs, torch.arange(n)[None], causal_mask(n, 0, inputs.dtype, "cpu"))[0, -1]
                chain.append(int(prophet.vocab.to_target_ids(logits.argmax())))
                tokens.append(chain[-1])
        assert drafted == chain
        checked += len(drafted)
        ids += rnd.committed
    assert checked > 0


# ---------------------------------------------------------------------------------------------- sampling

@pytest.fixture(scope="module")
def small():
    return small_models()


def _sampled_pairs(make, lm, runs=RUNS):
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(runs):
        trace = run_with(make, lm, PROMPT, 2, StaticRule(2), Warp(1.0), seed=seed)
        counts[trace.output_ids[0], trace.output_ids[1]] += 1
    return counts


def _drafters(lm):
    return {"early-exit": _early_exit(lm, 1, noise=0.5),
            "early-exit reduced vocab": _early_exit(lm, 1, torch.tensor([0, 2, 3, 5]), noise=0.5),
            "prophet": _prophet(lm, 1, noise=1.0)}


@pytest.mark.parametrize("name", ["early-exit", "early-exit reduced vocab", "prophet"])
def test_sampling_follows_the_target(small, name):
    lm = small["target"]
    pvalue = chi_square_pvalue(_sampled_pairs(_drafters(lm)[name], lm), exact_pairs(lm, Warp(1.0)))
    assert pvalue > BOUND, f"{name}: chi-square p = {pvalue:.2e}"


@pytest.mark.parametrize("name", ["early-exit", "prophet"])
def test_the_chi_square_test_catches_a_wrong_residual(small, monkeypatch, name):
    """Negative control: resampling from r instead of norm(max(r - q, 0)) must fail the same bound."""
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    lm = small["target"]
    pvalue = chi_square_pvalue(_sampled_pairs(_drafters(lm)[name], lm, runs=400), exact_pairs(lm, Warp(1.0)))
    assert pvalue < BOUND, f"{name}: the mutated residual went unnoticed (p = {pvalue:.2e})"


# ---------------------------------------------------------------------------------------------- store, registry

def test_saved_weights_drive_the_registry_drafters(four_layers, tmp_path):
    from decoders.selfdraft import store

    lm = four_layers["llama"]
    torch.manual_seed(1)
    block = ExitBlock(lm.model, 2, vocab_ids=torch.arange(40))
    with torch.no_grad():
        block.layers[0].mlp.down_proj.weight.mul_(1.5)  # differs from its initial copy: a real round trip
    prophet = Prophet(lm.model, 1)
    store.save(block, tmp_path / "ee")
    store.save(prophet, tmp_path / "pr", dtype=torch.float16)
    loaded = store.load(tmp_path / "ee", lm.model)
    assert loaded.exit_layer == 2 and torch.equal(loaded.vocab.vocab_ids, torch.arange(40))
    assert torch.equal(loaded.layers[0].mlp.down_proj.weight, block.layers[0].mlp.down_proj.weight)
    for name, folder in (("early-exit", tmp_path / "ee"), ("prophet", tmp_path / "pr")):
        options = DecodeOptions(method="speculative", drafter=name, self_weights=str(folder), max_new_tokens=20)
        trace = generate(options, PROMPTS[1], target=lm)
        assert trace.output_ids == baseline_ids(lm, PROMPTS[1], 20)


def test_missing_weights_say_how_to_train_them(four_layers, monkeypatch, tmp_path):
    from decoders.selfdraft import store

    monkeypatch.setattr(store, "cache_dir", lambda kind, target: tmp_path / kind / target)
    lm = four_layers["llama"]
    with pytest.raises(OptionsError, match="python -m decoders.selfdraft train --kind prophet"):
        generate(DecodeOptions(model=lm.name, method="speculative", drafter="prophet", max_new_tokens=4), [1, 2],
                 target=lm)


def test_weights_of_another_shape_are_refused_clearly(four_layers, tmp_path):
    from decoders.selfdraft import store
    from tiny import tiny_llama

    store.save(ExitBlock(tiny_llama(seed=1, layers=4, vocab=80).model, 2), tmp_path / "other")
    with pytest.raises(OptionsError, match="early-exit"):
        generate(DecodeOptions(method="speculative", drafter="early-exit", self_weights=str(tmp_path / "other"),
                               max_new_tokens=4), [1, 2], target=four_layers["llama"])


def test_the_drafters_are_registered_chain_drafters():
    from decoders import registry
    from decoders.options import DRAFTERS

    for name in ("early-exit", "prophet"):
        assert name in DRAFTERS and registry.drafter(name).family == registry.Family.CHAIN
        assert "adaedl" in registry.drafter(name).rules


# ---------------------------------------------------------------------------------------------- training

def test_training_raises_held_out_acceptance_and_writes_curves(tmp_path):
    """Text from the target itself (greedy continuations): an exit block and a prophet both learn to predict it."""
    from tiny import tiny_llama

    from decoders.eagle.data import Example
    from decoders.selfdraft.record import record
    from decoders.selfdraft.train import exit_alpha, init_exit, init_prophet, prophet_alpha, train_exit, train_prophet
    from decoders.training import FitSettings, save_curves

    lm = tiny_llama(seed=2, layers=4, scale=0.6)
    g = torch.Generator().manual_seed(0)
    examples = []
    with torch.inference_mode():
        for _ in range(40):
            ids = lm.model.generate(torch.randint(0, 64, (1, 3), generator=g), max_new_tokens=37, do_sample=True,
                                    top_k=3, pad_token_id=0)[0]
            examples.append(Example(ids, torch.ones(len(ids), dtype=torch.bool)))
    data = record(lm.model, examples, [2])
    train, held = data[8:], data[:8]
    settings = FitSettings(lr=1e-2, max_steps=200, warmup_steps=5, eval_every_minutes=1e9)
    block = ExitBlock(lm.model, 2)
    init_exit(block, train)  # the least-squares lens start
    before = exit_alpha(block, held)["alpha"][0]
    history = train_exit(block, train, held, settings, batch_tokens=400, log=lambda line: None)
    assert history.evals[-1][1]["alpha"][0] > before
    assert history.losses[-1][1] < 0.7 * history.losses[0][1]  # measured: 2.99 -> 1.82
    prophet = Prophet(lm.model, 1)
    untrained = prophet_alpha(prophet, held)["mean_accepted"]
    init_prophet(prophet, train)
    fitted = prophet_alpha(prophet, held)["mean_accepted"]
    assert fitted > untrained  # measured: .007 -> .051
    history = train_prophet(prophet, train, held, settings, batch_tokens=400, log=lambda line: None)
    assert history.evals[-1][1]["mean_accepted"] > fitted  # measured: -> .081
    assert history.losses[-1][1] < 0.6 * history.losses[0][1]
    json_path, png_path = save_curves(history, tmp_path, "prophet")
    assert png_path.stat().st_size > 1000 and "alpha" in json_path.read_text()


def test_the_exit_view_draws_shared_and_verification_only_layers():
    from app.figures.self_draft import exit_figure
    from decoders.trace import Trace

    trace = Trace(method="speculative", label="x", options={}, models={}, precision="float32", prompt="", prompt_ids=[])
    assert exit_figure(trace) is None  # other drafters: no view
    trace.totals = {"self_draft": {"kind": "early-exit", "exit_layer": 3, "target_layers": 8, "block_layers": 1,
                                   "reused_layer_tokens": 12}}
    fig = exit_figure(trace)
    hovers = [t.text for t in fig.data]
    assert sum("shared" in h for h in hovers) == 3 and sum("only in verification" in h for h in hovers) == 5
    assert any("12 token x layer passes" in h for h in hovers) and fig.layout.meta
    trace.totals = {"self_draft": {"kind": "prophet", "block_layers": 2, "target_layers": 8}}
    assert "2 layer(s)" in exit_figure(trace).layout.title.text


def test_the_bench_races_candidate_weights_beside_the_shipped_ones(four_layers, tmp_path):
    """bench.self_drafters --candidate KIND=DIR: new weights get their own arm, on their own folder, in the same run."""
    from bench import self_drafters
    from decoders.selfdraft import store

    store.save(ExitBlock(four_layers["llama"].model, 3), tmp_path / "ee-k3")
    arm = self_drafters.candidate(f"early-exit={tmp_path / 'ee-k3'}")
    assert arm.key == "candidate/early-exit" and "after layer 3" in arm.label
    assert arm.options["self_weights"] == str(tmp_path / "ee-k3") and arm.options["drafter"] == "early-exit"
    with pytest.raises(SystemExit, match="early-exit=FOLDER"):
        self_drafters.candidate("eagle=somewhere")
