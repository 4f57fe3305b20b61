"""The EAGLE-3 head (decoders/eagle/head3.py) on tiny random-init models: SafeAILab's layout and key names, the
save/load round trip through the one loader, the fused features handed over by the verification forward, greedy
trees (EAGLE-2, DDD, EAGLE-1 static) equal to the baseline, sampling that follows the target, and training."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache
from tree_helpers import BOUND, LENGTHS, PROMPT, PROMPTS, RUNS, TREES, VOCAB, baseline_ids, exact_pairs, small_models, \
    tree_options

from chi_square import chi_square_pvalue
from decoders import generate
from decoders.drafters.tree_draft import TreeShape
from decoders.eagle.head3 import Eagle3Head, default_feature_layers
from decoders.eagle.official import EagleHeadError, load_official, save_official
from decoders.sampling import Warp
from test_training_compare import replies  # noqa: F401  (the fixture: a tiny reply store)
from test_tree_head import run_with
from tiny import tiny_gemma3, tiny_llama, tiny_qwen2

D, V = 32, 64  # tiny models: hidden size, vocabulary

# What SafeAILab/EAGLE's cnets.Model (use_eagle3=True) holds for a Llama target with hidden size D, 4 heads of 8,
# 2 KV heads, MLP 64 and an N-token draft vocabulary, written out by hand from its source (not from our module).
N = 40
OFFICIAL_EAGLE3_KEYS = {
    "fc.weight": (D, 3 * D), "midlayer.hidden_norm.weight": (D,), "midlayer.input_layernorm.weight": (D,),
    "midlayer.post_attention_layernorm.weight": (D,),
    "midlayer.self_attn.q_proj.weight": (D, 2 * D), "midlayer.self_attn.k_proj.weight": (16, 2 * D),
    "midlayer.self_attn.v_proj.weight": (16, 2 * D), "midlayer.self_attn.o_proj.weight": (D, D),
    "midlayer.mlp.gate_proj.weight": (64, D), "midlayer.mlp.up_proj.weight": (64, D),
    "midlayer.mlp.down_proj.weight": (D, 64), "norm.weight": (D,), "lm_head.weight": (N, D), "d2t": (N,), "t2d": (V,),
}


def _head(target, vocab: int | None = None, seed: int = 0) -> Eagle3Head:
    torch.manual_seed(seed)
    ids = torch.randperm(target.config.vocab_size)[:vocab] if vocab else None
    return Eagle3Head(target, vocab_ids=ids)


def test_state_dict_is_safeailabs_eagle3_layout():
    head = _head(tiny_llama().model, vocab=N)
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == OFFICIAL_EAGLE3_KEYS
    assert head.fc.bias is None
    ids = head.draft_ids
    assert torch.equal(ids, ids.sort().values) and int(head.t2d.sum()) == N and bool(head.t2d[ids].all())
    columns = torch.tensor([0, 5, N - 1])
    assert torch.equal(head.to_target_ids(columns), ids[columns])  # target id = draft id + d2t[draft id]


def test_default_layers_are_safeailabs_low_mid_high():
    assert default_feature_layers(30) == (2, 15, 27)  # SmolLM2-135M: entering layers 2, L // 2, L - 3
    assert default_feature_layers(32) == (2, 16, 29)
    assert len(set(default_feature_layers(3))) == 3


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_forward_shapes_lift_and_cache_equal_full_forward(make):
    head = _head(make(layers=4).model, vocab=N)
    ids, fused = torch.randint(0, V, (2, 7)), torch.randn(2, 7, 3 * D)
    hidden, logits = head(ids, fused)
    assert hidden.shape == (2, 7, D) and logits.shape == (2, 7, N)
    own, _ = head(ids, head.fc(fused))  # the head's own d-wide features skip the fc: lift is the only difference
    torch.testing.assert_close(own, hidden)
    cache = DynamicCache(config=head.config)
    first, _ = head(ids[:1, :4], fused[:1, :4], cache=cache)
    second, _ = head(ids[:1, 4:], fused[:1, 4:], cache=cache)
    torch.testing.assert_close(torch.cat([first, second], 1), hidden[:1], atol=1e-5, rtol=1e-5)


def test_untrained_head_starts_from_the_targets_output_space():
    target = tiny_llama(layers=4).model
    head = _head(target, vocab=N)
    final = torch.randn(3, D)
    torch.testing.assert_close(head.lm_head(final), head.label_logits(final))  # lm_head = the target's rows
    assert head.target_logits(final).shape == (3, V)


def test_gemma3_layers_are_refused_with_a_message():
    with pytest.raises(ValueError, match="Llama-style layers"):
        Eagle3Head(tiny_gemma3().model)


def test_round_trip_through_the_one_loader(tmp_path):
    target = tiny_llama(layers=4).model
    head = _head(target, vocab=N)
    save_official(head, tmp_path / "h3")
    loaded = load_official(tmp_path / "h3", target)
    assert isinstance(loaded, Eagle3Head) and loaded.feature_layers == head.feature_layers
    ids, fused = torch.randint(0, V, (1, 5)), torch.randn(1, 5, 3 * D)
    for got, want in zip(loaded(ids, fused), head(ids, fused)):
        torch.testing.assert_close(got, want)


def test_hand_built_safeailab_state_loads_and_full_vocab_may_omit_d2t(tmp_path):
    from safetensors.torch import save_file

    from decoders.eagle.official import official_config

    target = tiny_llama(layers=4).model
    full = {k: torch.randn(*shape) for k, shape in OFFICIAL_EAGLE3_KEYS.items() if k not in ("d2t", "t2d")}
    full["lm_head.weight"] = torch.randn(V, D)
    full["embed_tokens.weight"] = torch.randn(V, D)  # some releases carry it; the target's is used
    folder = tmp_path / "safeailab"
    folder.mkdir()
    save_file(full, str(folder / "model.safetensors"))
    config = official_config(_head(target))
    config.pop("speclab")  # a SafeAILab head: no feature_layers written, the default ones are used
    (folder / "config.json").write_text(__import__("json").dumps(config))
    head = load_official(folder, target)
    assert head.vocab_size == V and head.vocab_ids is None and head.feature_layers == default_feature_layers(4)
    torch.testing.assert_close(head.lm_head.weight, full["lm_head.weight"])


def test_eagle3_head_with_a_wrong_vocabulary_is_refused(tmp_path):
    target = tiny_llama(layers=4).model
    save_official(_head(target, vocab=N), tmp_path / "h3")
    config = tmp_path / "h3" / "config.json"
    config.write_text(config.read_text().replace(f'"draft_vocab_size": {N}', f'"draft_vocab_size": {N + 1}'))
    with pytest.raises(EagleHeadError, match="d2t"):
        load_official(tmp_path / "h3", target)


def test_verification_forward_hands_over_the_fused_layers():
    from decoders.runtime.runner import CachedModel
    from decoders.tree import DraftTree

    lm = tiny_llama(layers=4)
    runner = CachedModel(lm.model)
    runner.forward([3, 9, 4])
    tree = DraftTree(tokens=[1, 20, 21, 30], parents=[-1, 0, 0, 1], q_token=[None] * 4)
    layers = default_feature_layers(4)
    with torch.inference_mode():
        logits, fused = runner.forward_tree(tree, hidden=layers)  # (4, V), (4, 3D)
        ids = torch.tensor([[3, 9, 4, 1, 20, 21, 30]])
        mask = torch.ones(7, 7).tril().bool()
        mask[5, 4] = False  # node 2 (21) is the root's child, not node 1's
        mask[6, 5] = False  # node 3 (30) hangs under node 1
        reference = lm.model(ids, attention_mask=_additive(mask), position_ids=torch.tensor([[0, 1, 2, 3, 4, 4, 5]]),
                             output_hidden_states=True)
    want = torch.cat([reference.hidden_states[k][0, 3:] for k in layers], -1)  # (4, 3D)
    assert fused.shape == (4, 3 * D)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, reference.logits[0, 3:], atol=1e-5, rtol=1e-5)


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(allowed.shape)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None]  # (1, 1, n, n)


@pytest.fixture(scope="module")
def head3_pair():
    target = tiny_llama(seed=5, layers=4)
    return target, _head(target.model, vocab=48)


@pytest.mark.parametrize("name", list(TREES))
def test_eagle3_head_tree_greedy_equals_baseline(head3_pair, name):
    from decoders import registry
    from decoders.drafters import EagleTreeDrafter

    target, head = head3_pair
    shape = registry.tree_shape(tree_options(TREES[name]))
    drafted = 0
    for prompt in PROMPTS:
        for length in LENGTHS:
            trace = run_with(EagleTreeDrafter(head, shape), target, prompt, length, rule_depth=shape.steps)
            assert trace.output_ids == baseline_ids(target, prompt, length), (name, prompt, length)
            drafted += sum(r.n_drafted for r in trace.rounds)
    assert drafted > 0


def test_eagle3_drafts_from_the_fused_features_of_the_context(head3_pair):
    """K = 1: each round's chain recomputed from scratch (fresh fused target features over the whole context, the
    head over all pairs, its own g after that) equals what the drafter grew with its cache."""
    from decoders.drafters import EagleTreeDrafter

    target, head = head3_pair
    trace = run_with(EagleTreeDrafter(head, TreeShape(k=1, steps=3, m=3)), target, PROMPTS[1], 24, rule_depth=3)
    ids = list(PROMPTS[1])
    for rnd in trace.rounds:
        drafted = [node.token for node in rnd.nodes[1:]]
        assert drafted == _reference_chain(target, head, ids, len(drafted))
        ids += rnd.committed


def _reference_chain(target, head, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
        feats = head.lift(torch.cat([out.hidden_states[k][0] for k in head.feature_layers], -1))  # (T-1, d)
        tokens, chain = list(ids[1:]), []
        for _ in range(n):
            hidden, logits = head(torch.tensor([tokens]), feats[None])  # (1, L, d), (1, L, N)
            chain.append(int(head.to_target_ids(logits[0, -1].argmax())))
            feats = torch.cat([feats, hidden[0, -1:]])
            tokens.append(chain[-1])
    return chain


def test_eagle_head_option_loads_an_eagle3_folder(head3_pair, tmp_path):
    target, head = head3_pair
    save_official(head, tmp_path / "h3")
    for drafter in ("eagle2", "ddd", "eagle1"):
        options = tree_options(TREES[drafter], eagle_head=str(tmp_path / "h3"), max_new_tokens=20)
        trace = generate(options, PROMPTS[1], target=target)
        assert trace.output_ids == baseline_ids(target, PROMPTS[1], 20)
        assert trace.rounds[0].search["method"] == f"{drafter}-head"


@pytest.mark.parametrize("kv_cache", ["static", "fixed"])
def test_eagle3_head_with_preallocated_kv_equals_baseline(head3_pair, tmp_path, kv_cache):
    """"fixed" runs the verification forward through runtime/graphs.FixedForward, which picks the fused layers too."""
    target, head = head3_pair
    save_official(head, tmp_path / "h3")
    options = tree_options(TREES["eagle2"], eagle_head=str(tmp_path / "h3"), max_new_tokens=20, kv_cache=kv_cache)
    trace = generate(options, PROMPTS[1], target=target)
    assert trace.output_ids == baseline_ids(target, PROMPTS[1], 20)
    dynamic = generate(replace(options, kv_cache="dynamic"), PROMPTS[1], target=target)
    drafts = lambda t: [[node.token for node in r.nodes] for r in t.rounds]  # noqa: E731
    assert drafts(trace) == drafts(dynamic)  # the same fused features, so the same trees


def test_eagle3_head_tree_sampling_follows_the_target():
    from decoders.drafters import EagleTreeDrafter

    small = small_models()
    head = _head(small["target"].model)
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(RUNS):
        trace = run_with(EagleTreeDrafter(head, TreeShape(k=2, steps=2, m=4)), small["target"], PROMPT, 4,
                         rule_depth=2, warp=Warp(1.0), seed=seed)
        counts[trace.output_ids[0], trace.output_ids[1]] += 1
    pvalue = chi_square_pvalue(counts, exact_pairs(small["target"], Warp(1.0)))
    assert pvalue > BOUND, f"chi-square p = {pvalue:.2e}"


# ---- training ----

def _fused_corpus(target, head, count: int, seed: int):
    from test_eagle_train import _tiny_corpus

    from decoders.eagle.data import target_features

    return target_features(target, _tiny_corpus(count, 40, seed=seed), store_dtype=torch.float32,
                           layers=head.feature_layers)


def test_training_lowers_the_loss_and_raises_heldout_acceptance():
    from test_eagle_train import VOCAB as CORPUS_VOCAB

    from decoders.eagle.train import TrainSettings, acceptance_by_depth, collate, loss_terms, train_head

    torch.set_num_threads(1)
    target = tiny_llama(vocab=CORPUS_VOCAB, seed=3, layers=2).model
    head = _head(target)
    train, heldout = _fused_corpus(target, head, 48, seed=1), _fused_corpus(target, head, 12, seed=2)
    assert train[0].features.shape[-1] == 3 * D and train[0].top.shape[-1] == D
    probe = collate(heldout, "cpu", torch.float32)
    with torch.no_grad():
        before = [float(t) for t in loss_terms(head, probe, depths=3)]
    alpha_before = acceptance_by_depth(head, heldout, depths=3)
    settings = TrainSettings(lr=3e-3, max_steps=250, batch_tokens=400, warmup_steps=10, eval_every_minutes=1e9,
                             ttt_depths=3, noise_std=0.0)
    history = train_head(head, train, heldout, settings, log=lambda line: None)
    with torch.no_grad():
        after = [float(t) for t in loss_terms(head, probe, depths=3)]
    alpha_after = acceptance_by_depth(head, heldout, depths=3)
    assert history.steps == 250
    assert before[0] == after[0] == 0.0  # no regression term: g is not trained to be a target feature
    assert after[1] < before[1] - 0.2  # cross-entropy against the target's distribution, over 3 draft depths
    assert alpha_after["alpha"][0] > alpha_before["alpha"][0] + 0.1
    assert target.lm_head.weight.grad is None and target.model.embed_tokens.weight.grad is None  # target frozen


def test_training_time_test_depth_two_is_the_heads_real_second_draft():
    """loss_terms(depths=2) = mean of the teacher-forced CE and the CE of step 2 of each chain, where step 2 is a
    real draft: a fresh cache over the real fused prefix, then the head's own step-1 output (no fc)."""
    from decoders.eagle.train import Batch, loss_terms, target_probs

    target = tiny_llama(vocab=48, seed=3, layers=4).model
    head = _head(target)
    [example] = _fused_corpus(target, head, 1, seed=1)
    n = len(example.ids)
    batch = Batch(example.ids[None], example.features[None], torch.ones(1, n, dtype=torch.bool), example.final[None])
    with torch.no_grad():
        both, one = loss_terms(head, batch, depths=2)[1], loss_terms(head, batch, depths=1)[1]
        fused, tokens, top = example.features[None], example.ids[None], example.final[None]
        step1 = head.features(tokens[:, 1:], fused[:, :-1])  # (1, n-1, d)
        ces = []
        for m in range(1, n - 1):  # step 2 of the chain begun at m - 1, drafted at position m
            cache = DynamicCache(config=head.config)
            head.features(tokens[:, 1:m + 1], fused[:, :m], cache=cache)
            g = head.features(tokens[:, m + 1:m + 2], step1[:, m - 1:m], torch.tensor([[m]]), cache)  # (1, 1, d)
            p = target_probs(head, top[:, m + 1:m + 2])
            ces.append(-(p * torch.log_softmax(head.logits(g), -1)).sum())
    torch.testing.assert_close(both, (one + torch.stack(ces).mean()) / 2, rtol=1e-4, atol=1e-5)


def test_an_eagle3_checkpoint_exports_and_is_compared_with_an_eagle1_head(replies, tmp_path):
    """The ship rule's comparison (training/compare.py) takes an EAGLE-3 checkpoint: exported in SafeAILab's layout,
    scored on fused features recomputed from the target, τ decoded with outputs equal to the EAGLE-1 head's."""
    from decoders.eagle.data import featurized_for
    from decoders.eagle.head import EagleHead
    from decoders.eagle.train import TrainSettings, acceptance_by_depth, train_head
    from decoders.training.compare import compare, export_checkpoint, load_drafter
    from decoders.training.replies import ReplyStore

    lm, folder = replies
    store = ReplyStore(folder)
    torch.manual_seed(0)
    head = Eagle3Head(lm.model)
    train, held = featurized_for(head, store.load("train")), featurized_for(head, store.load("heldout"))
    settings = TrainSettings(lr=3e-3, max_steps=20, batch_tokens=300, warmup_steps=5, eval_every_minutes=1e9,
                             ttt_depths=2, noise_std=0.0)
    train_head(head, train, held, settings, log=lambda line: None, checkpoint={"path": tmp_path / "c3.pt"})
    exported = export_checkpoint("eagle", tmp_path / "c3.pt", lm.model, tmp_path / "out", torch.float32)
    again = load_drafter("eagle", exported, lm.model)
    assert isinstance(again, Eagle3Head)
    assert acceptance_by_depth(again, held) == acceptance_by_depth(head.eval(), held)  # the export is the head
    eagle1 = save_official(EagleHead(lm.model), tmp_path / "eagle1", dtype=torch.float32)
    record = compare("eagle", lm, folder, tmp_path / "c3.pt", eagle1, depths=3, decode_prompts=2, max_new=12,
                     save_dtype=torch.float32, log=lambda line: None)
    assert record["outputs_equal"]  # greedy: either head changes the speed, never the text
    assert record["scores"]["candidate"]["tau"] > 0 and len(record["scores"]["candidate"]["alpha"]) == 3


def test_cli_trains_an_eagle3_head_on_replies_and_writes_its_card(tmp_path, monkeypatch):
    """`python -m decoders.eagle train --arch eagle3 --replies DIR`: fused features from the target, TTT 3 deep by
    default, saved in SafeAILab's EAGLE-3 layout with its model card and training record."""
    import json
    from types import SimpleNamespace

    import decoders.runtime.models as models
    from decoders.eagle.__main__ import main
    from decoders.training.prompts import Prompt
    from decoders.training.replies import ReplyStore, write_replies
    from test_training_replies import CharTokenizer

    lm = tiny_llama(seed=5, layers=4)
    store = ReplyStore(tmp_path / "replies")
    prompts = [Prompt(f"p{i}", "heldout" if i < 3 else "train", ({"role": "user", "content": f"say {i} {i * 7}"},))
               for i in range(12)]
    for split in ("heldout", "train"):
        write_replies(lm.model, CharTokenizer(), prompts, store, split, 0, batch=6, max_new=16, max_prompt=40,
                      stems=[1], meta={"target": lm.name})
    loaded = SimpleNamespace(model=lm.model, name=lm.name, device=torch.device("cpu"), source="tiny", tokenizer=None)
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: loaded)
    out = tmp_path / "head"
    code = main(["train", "--arch", "eagle3", "--target", lm.name, "--replies", str(tmp_path / "replies"),
                 "--max-steps", "3", "--batch-tokens", "200", "--draft-vocab", "40", "--eval-every", "1000",
                 "--out", str(out)])
    assert code == 0
    head = load_official(out, lm.model)
    assert isinstance(head, Eagle3Head) and head.vocab_size == 40
    info = json.loads((out / "training.json").read_text())
    assert (info["arch"], info["ttt_depths"], info["steps"]) == ("eagle3", 3, 3)
    assert (out / "README.md").read_text().startswith("# EAGLE-3 draft head")
