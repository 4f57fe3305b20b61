"""Training data for learned drafters: the target's own replies (self-distillation) and the bench's prompts kept out."""
from __future__ import annotations

import random

import torch

from decoders.eagle.__main__ import conversations
from decoders.eagle.data import bench_source_ids, humaneval_prompts, load_sharegpt, to_messages
from decoders.training.continuations import generated_examples
from tiny import tiny_llama

VOCAB = 64


class _CharTokenizer:
    """A base-model tokenizer stand-in (no chat template): one token per character."""

    eos_token_id = None
    pad_token_id = 0

    def encode(self, text, add_special_tokens=True):
        return [1 + ord(c) % (VOCAB - 1) for c in text]


def _greedy(model, ids: list[int], steps: int) -> list[int]:
    """Plain greedy decoding, one full forward per token: the reference."""
    out = list(ids)
    for _ in range(steps):
        logits = model(torch.tensor([out])).logits[0, -1]  # (V,)
        out.append(int(logits.argmax()))
    return out[len(ids):]


@torch.inference_mode()
def test_generated_examples_are_the_targets_greedy_replies_with_loss_on_the_reply_only():
    model = tiny_llama(vocab=VOCAB, seed=5).model
    model.generation_config.eos_token_id = None
    tokenizer = _CharTokenizer()
    prompts = [[{"role": "user", "content": text}] for text in ("abc", "hello there", "x", "the quick brown fox")]
    examples = generated_examples(model, tokenizer, prompts, max_len=40, max_tokens=10**6, batch=3, min_reply=8)
    assert len(examples) == 4
    for example in examples:
        n_prompt = int((~example.loss_mask).sum())
        prompt, reply = example.ids[:n_prompt].tolist(), example.ids[n_prompt:].tolist()
        assert example.loss_mask[n_prompt:].all() and len(reply) >= 8
        assert len(example.ids) <= 40
        assert reply == _greedy(model, prompt, len(reply))  # left padding in the batch changed nothing


@torch.inference_mode()
def test_a_reply_stops_at_its_end_of_sequence_token_and_the_token_budget_is_kept():
    model = tiny_llama(vocab=VOCAB, seed=5).model
    tokenizer = _CharTokenizer()
    prompt = tokenizer.encode("hello there\n\n")
    free = _greedy(model, prompt, 12)
    stop = free[5]  # end the reply at the greedy path's sixth token (or earlier, where it occurs first)
    model.generation_config.eos_token_id = stop
    [example] = generated_examples(model, tokenizer, [[{"role": "user", "content": "hello there"}]], max_len=60,
                                   max_tokens=10**6, min_reply=8)
    reply = example.ids[len(prompt):].tolist()
    assert reply == free[: free.index(stop) + 1]
    model.generation_config.eos_token_id = None
    many = [[{"role": "user", "content": f"prompt {i}"}] for i in range(40)]
    budget = generated_examples(model, tokenizer, many, max_len=30, max_tokens=50, batch=2, min_reply=8)
    assert 50 <= sum(len(e.ids) for e in budget) < 50 + 2 * 30  # stops after the batch that reached the budget


def test_training_text_never_holds_a_benchmark_prompt(monkeypatch):
    excluded = bench_source_ids()
    assert any(i.startswith("HumanEval/") for i in excluded) and any(not i.startswith("HumanEval/") for i in excluded)
    assert len(humaneval_prompts()) == 164 - sum(i.startswith("HumanEval/") for i in excluded)
    records = load_sharegpt()
    monkeypatch.setattr("decoders.eagle.__main__.load_sharegpt", lambda: records)  # read the file once
    bench_firsts = {to_messages(r)[0]["content"] for r in records if r.get("id") in excluded}
    assert bench_firsts  # the bench's chat prompts are ShareGPT conversations
    for kind in ("sharegpt", "generated"):
        train, held, _ = conversations(kind, heldout=24, seed=0)
        assert not bench_firsts & {chat[0]["content"] for chat in train}
    # the held-out split is the same seeded sample as before the exclusion
    chats = [m for m in (to_messages(r) for r in records) if len(m) >= 2]
    random.Random(0).shuffle(chats)
    assert held == chats[:24]
