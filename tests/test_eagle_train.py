"""EAGLE head training on a tiny random-init target, the depth mask, and the ShareGPT reader."""
from __future__ import annotations

import io
import json

import pytest
import torch

from decoders.eagle.data import (SHAREGPT_COMPLETE_RECORDS, Example, encode_chat, load_sharegpt, sharegpt_records,
                                 target_features, to_messages)
from decoders.eagle.head import EagleHead
from decoders.eagle.train import TrainSettings, acceptance_by_depth, depth_mask, loss_terms, collate, train_head
from tiny import tiny_llama

VOCAB = 48


def _tiny_corpus(count: int, length: int, seed: int) -> list[Example]:
    """Token sequences from a fixed random bigram chain: text with structure a head can learn."""
    generator = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(99)) * 3, -1)
    examples = []
    for _ in range(count):
        ids = [int(torch.randint(0, VOCAB, (1,), generator=generator))]
        for _ in range(length - 1):
            ids.append(int(torch.multinomial(transitions[ids[-1]], 1, generator=generator)))
        mask = torch.ones(length, dtype=torch.bool)
        mask[:4] = False  # a "prompt" the loss skips
        examples.append(Example(torch.tensor(ids), mask))
    return examples


def test_training_lowers_loss_and_raises_heldout_acceptance():
    torch.set_num_threads(1)
    target = tiny_llama(vocab=VOCAB, seed=3).model
    train = target_features(target, _tiny_corpus(48, 40, seed=1), store_dtype=torch.float32)
    heldout = target_features(target, _tiny_corpus(12, 40, seed=2), store_dtype=torch.float32)
    head = EagleHead(target)
    probe = collate(heldout, "cpu", torch.float32)
    with torch.no_grad():
        before_loss = [float(t) for t in loss_terms(head, probe)]
    before = acceptance_by_depth(head, heldout, depths=3)
    settings = TrainSettings(lr=3e-3, max_steps=250, batch_tokens=400, warmup_steps=10, eval_every_minutes=1e9)
    history = train_head(head, train, heldout, settings, log=lambda line: None)
    with torch.no_grad():
        after_loss = [float(t) for t in loss_terms(head, probe)]
    after = acceptance_by_depth(head, heldout, depths=3)
    assert history.steps == 250
    assert after_loss[0] < 0.85 * before_loss[0]  # feature regression
    assert after_loss[1] < before_loss[1] - 0.2  # cross-entropy against the target's (high-entropy) distribution
    assert after["alpha"][0] > before["alpha"][0] + 0.1
    assert after["recall"][1] > before["recall"][1] + 0.1
    assert target.lm_head.weight.grad is None  # the target stayed frozen


def test_depth_mask_gives_each_draft_step_exactly_its_chain():
    mask = depth_mask(5, 3, torch.float32, "cpu")[0, 0] == 0  # (5, 15) allowed
    row = 4  # depth-3 step at position 4: chain started at 2
    assert mask[row, :5].tolist() == [True, True, True, False, False]  # real keys up to the chain's start
    assert mask[row, 5:10].tolist() == [False, False, False, True, False]  # its depth-2 ancestor (position 3)
    assert mask[row, 10:].tolist() == [False, False, False, False, True]  # itself
    assert (depth_mask(4, 1, torch.float32, "cpu")[0, 0] == 0).tril().sum() == 10


def _truncated_array(records: list[dict], cut: int) -> str:
    text = json.dumps(records, indent=2)
    return text[: len(text) - cut]


def test_sharegpt_reader_keeps_complete_records_and_drops_a_cut_tail():
    records = [{"id": str(i), "conversations": [{"from": "human", "value": "x" * i + "]},{"}]} for i in range(30)]
    text = _truncated_array(records, cut=40)  # the last record loses its end
    got = list(sharegpt_records(io.StringIO(text), chunk_chars=64))  # small chunks: records span reads
    assert [r["id"] for r in got] == [str(i) for i in range(29)]
    whole = list(sharegpt_records(io.StringIO(json.dumps(records)), chunk_chars=50))
    assert len(whole) == 30


def test_sharegpt_package_has_the_expected_complete_conversations():
    records = load_sharegpt()
    assert len(records) == SHAREGPT_COMPLETE_RECORDS == 17_671
    assert to_messages(records[0])[0]["role"] == "user"


def test_to_messages_maps_roles_and_skips_leading_assistant_and_empty_turns():
    record = {"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "q"},
                                {"from": "gpt", "value": ""}, {"from": "gpt", "value": "a"}]}
    assert to_messages(record) == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


class _Template:
    """A tokenizer stand-in with a chat template: one token per character, '|' between turns."""

    chat_template = "yes"

    def apply_chat_template(self, messages, tokenize=False):
        return "".join(("U" if m["role"] == "user" else "A") + m["content"] + "|" for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_encode_chat_masks_exactly_the_assistant_turns():
    example = encode_chat(_Template(), [{"role": "user", "content": "abcd"}, {"role": "assistant", "content": "xyz"},
                                        {"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}], 64)
    text = "".join(chr(i) for i in example.ids.tolist())
    marked = "".join(c for c, m in zip(text, example.loss_mask.tolist()) if m)
    assert text == "Uabcd|Axyz|Uq|Aok|" and marked == "Axyz|Aok|"


def test_frequent_ids_picks_the_most_common_tokens_in_id_order():
    from decoders.eagle.data import frequent_ids

    examples = [Example(torch.tensor([5, 5, 5, 2, 2, 9]), torch.ones(6, dtype=torch.bool)),
                Example(torch.tensor([2, 7]), torch.ones(2, dtype=torch.bool))]
    assert frequent_ids(examples, 2, vocab=10).tolist() == [2, 5]
    assert frequent_ids(examples, 4, vocab=10).tolist() == [2, 5, 7, 9]  # ties broken by id


def test_cli_unknown_target_is_one_line_not_a_traceback(capsys):
    from decoders.eagle.__main__ import main

    assert main(["train", "--target", "no-such-model-xyz", "--out", "/tmp/never"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model 'no-such-model-xyz'") and err.count("\n") == 1


def test_model_card_reports_alpha_by_depth_data_and_the_gpu_command():
    from decoders.eagle.card import model_card

    final = {"alpha": [0.5, 0.4], "recall": {1: 0.5, 4: 0.7, 10: 0.8}, "mean_accepted": 0.7, "chains": 100}
    text = model_card({"target": "t", "layer_class": "LlamaDecoderLayer", "final_eval": final,
                       "heldout_conversations": 3, "data": "ShareGPT", "train_examples": 5, "train_tokens": 1000,
                       "seq_len": 256, "steps": 7, "batch_tokens": 1024, "lr": 1e-3, "tokens_seen": 900,
                       "feature_seconds": 10.0, "train_seconds": 20.0, "total_seconds": 35.0, "hardware": "cpu",
                       "save_dtype": "float16", "size_mb": 8.4, "evals": [(7, final)], "command": "CMD-CPU",
                       "gpu_command": "CMD-GPU --device cuda", "draft_vocab": 50, "full_vocab_eval": None})
    assert "| α | 0.500 | 0.400 |" in text and "top-4: 0.700" in text and "(not met)" in text
    assert "CMD-CPU" in text and "CMD-GPU --device cuda" in text and "7 AdamW steps" in text
    assert "0.6 min wall in all" in text


def test_a_resumed_runs_card_counts_every_session_and_is_rewritten_from_its_training_json(tmp_path):
    import json

    from decoders.eagle import card

    final = {"alpha": [0.5, 0.4], "recall": {1: 0.5, 4: 0.7}, "mean_accepted": 0.7, "chains": 100}
    info = {"target": "t", "layer_class": "LlamaDecoderLayer", "final_eval": final, "heldout_conversations": 3,
            "data": "replies", "train_examples": 5, "train_tokens": 1000, "seq_len": 256, "steps": 7,
            "batch_tokens": 1024, "lr": 1e-3, "tokens_seen": 900, "feature_seconds": 4.0, "train_seconds": 3190.0,
            "total_seconds": 240.0, "hardware": "cpu", "save_dtype": "float16", "size_mb": 8.4,
            "evals": [(7, final)], "command": "CMD", "gpu_command": "GPU", "draft_vocab": 50, "full_vocab_eval": None}
    text = card.model_card(info)  # a card without the flag: the last session was shorter than the training
    assert "53.2 min of training" in text and "the last session took 4.0 min wall" in text
    assert "wall in all" not in text
    (tmp_path / "training.json").write_text(json.dumps(info | {"resumed": True}))  # JSON: recall keys turn strings
    assert card.rewrite(tmp_path).read_text() == text


def test_model_card_of_an_eagle3_head_names_its_layout_layers_and_vocabulary():
    from decoders.eagle.card import model_card

    final = {"alpha": [0.5, 0.4], "recall": {1: 0.5, 4: 0.7, 10: 0.8}, "mean_accepted": 0.7, "chains": 100}
    text = model_card({"target": "t", "layer_class": "LlamaDecoderLayer", "final_eval": final, "arch": "eagle3",
                       "feature_layers": (2, 15, 27), "ttt_depths": 3, "heldout_conversations": 3, "data": "replies",
                       "train_examples": 5, "train_tokens": 1000, "seq_len": 256, "steps": 7, "batch_tokens": 1024,
                       "lr": 1e-3, "tokens_seen": 900, "feature_seconds": 10.0, "train_seconds": 20.0,
                       "total_seconds": 35.0, "hardware": "cpu", "save_dtype": "float32", "size_mb": 39.5,
                       "evals": [(7, final)], "command": "CMD-CPU", "gpu_command": "CMD-GPU --arch eagle3",
                       "draft_vocab": 8192, "full_vocab_eval": None})
    assert text.startswith("# EAGLE-3 draft head for t") and "(2, 15, 27)" in text and "midlayer" in text
    assert "8,192 target ids" in text and "the target's full vocabulary" not in text


def test_reduced_vocab_covering_every_id_measures_the_same_as_the_full_vocab():
    from decoders.eagle.measure import compare

    target = tiny_llama(vocab=VOCAB, seed=3).model
    corpus = _tiny_corpus(6, 24, seed=4)
    heldout = target_features(target, corpus, store_dtype=torch.float32)
    head = EagleHead(target)
    full, everything, few = compare(head, target, heldout, corpus, [0, VOCAB, 8], depths=2)
    assert (full["vocab"], everything["vocab"], few["vocab"]) == (VOCAB, VOCAB, 8)
    assert everything["alpha"] == full["alpha"] and everything["recall"] == full["recall"]
    assert full["ms_1"] > 0 and few["ms_10"] > 0


def test_training_time_test_scores_the_heads_own_second_draft_as_decoding_makes_it():
    """loss_terms(depths=2) = mean of the teacher-forced loss and the loss of step 2 of each chain, where step 2 is
    computed as a real draft: a fresh cache over the real prefix, then the head's own step-1 feature."""
    from transformers import DynamicCache

    from decoders.eagle.train import Batch, target_probs

    torch.manual_seed(0)
    target = tiny_llama(vocab=VOCAB, seed=3).model
    [example] = target_features(target, _tiny_corpus(1, 12, seed=1), store_dtype=torch.float32)
    head = EagleHead(target)
    batch = Batch(example.ids[None], example.features[None], torch.ones(1, 12, dtype=torch.bool))
    with torch.no_grad():
        both = loss_terms(head, batch, depths=2)
        one = loss_terms(head, batch, depths=1)
        feats, tokens = example.features[None], example.ids[None]
        step1 = head.features(tokens[:, 1:], feats[:, :-1])  # (1, 11, d): g_m for every m
        regs, ces = [], []
        for m in range(1, 11):  # step 2 of the chain begun at m - 1, drafted at position m
            cache = DynamicCache(config=head.config)
            head.features(tokens[:, 1:m + 1], feats[:, :m], cache=cache)  # the real prefix 0..m-1
            g = head.features(tokens[:, m + 1:m + 2], step1[:, m - 1:m], torch.tensor([[m]]), cache)  # (1, 1, d)
            wanted = feats[:, m + 1:m + 2]
            regs.append(torch.nn.functional.smooth_l1_loss(g, wanted))
            ces.append(-(target_probs(head, wanted) * torch.log_softmax(head.logits(g), -1)).sum())
        depth2 = (torch.stack(regs).mean(), torch.stack(ces).mean())
    torch.testing.assert_close(both[0], (one[0] + depth2[0]) / 2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(both[1], (one[1] + depth2[1]) / 2, rtol=1e-4, atol=1e-5)


def test_sharegpt_text_added_to_replies_never_reads_a_held_out_conversation(tmp_path, monkeypatch):
    """--with-sharegpt-tokens: dataset text in the trainers' permutation, less the reply store's held-out prompts."""
    import argparse
    import random

    import decoders.eagle.__main__ as cli
    from decoders.eagle.data import bench_source_ids

    records = load_sharegpt()
    pairs = [(r.get("id"), m) for r, m in ((r, to_messages(r)) for r in records) if len(m) >= 2]
    random.Random(0).shuffle(pairs)
    usable = [(sid, m) for sid, m in pairs if sid not in bench_source_ids()]
    held = [sid for sid, _ in usable[:3]]  # the store holds out the permutation's first three conversations
    (tmp_path / "heldout-00000.pt").write_bytes(b"")
    (tmp_path / "index.jsonl").write_text(json.dumps({"shard": "heldout-00000.pt", "split": "heldout",
                                                      "keys": [f"sharegpt:{sid}" for sid in held], "tokens": 1}) + "\n")
    seen = {}
    monkeypatch.setattr(cli, "build_examples", lambda tok, chats, n, budget: seen.setdefault("chats", chats) and [])
    args = argparse.Namespace(replies=str(tmp_path), seed=0, seq_len=256, with_sharegpt_tokens=1000)
    head = EagleHead(tiny_llama(vocab=VOCAB, seed=3).model)
    lm = argparse.Namespace(tokenizer=None, model=head._target[0])
    assert cli.sharegpt_besides_replies(args, lm, head) == []
    chats = seen["chats"]
    assert chats[0] == usable[3][1]  # the first conversation the store does not hold out
    assert not any(m is chat for chat in chats for _, m in usable[:3])
    assert len(chats) == len(usable) - 3
