"""The target's own replies with features recorded while it writes them: equal to a plain greedy decode and to a
full forward over the stored text; resumable by prompt key; held-out prompts never among the training prompts."""
from __future__ import annotations

import torch

from decoders.training.prompts import Prompt
from decoders.training.replies import ReplyStore, write_batch, write_replies
from tiny import tiny_llama

VOCAB = 64


class CharTokenizer:
    eos_token_id = None
    pad_token_id = 0

    def encode(self, text, add_special_tokens=True):
        return [1 + ord(c) % (VOCAB - 1) for c in text]


def greedy(model, ids: list[int], steps: int) -> list[int]:
    out = list(ids)
    for _ in range(steps):
        out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


@torch.inference_mode()
def test_batched_replies_carry_the_features_of_a_full_forward():
    model = tiny_llama(vocab=VOCAB, seed=5).model
    prompts = [[5, 6, 7], [9] * 11, [3, 4], [8, 1, 2, 3, 4, 5, 6]]
    free = greedy(model, prompts[2], 12)
    eos = {free[4]}  # one row stops early (at its first occurrence of this token), the others run to max_new
    records = write_batch(model, prompts, max_new=10, eos=eos, pad=0, stems=[1], store_dtype=torch.float32)
    for prompt, r in zip(prompts, records):
        n = len(prompt)
        reply = r.ids[n:].tolist() + [int(r.greedy[-1])]  # the last chosen token is a label, never fed
        reference = greedy(model, prompt, len(reply))
        assert reply == reference
        assert reply[-1] in eos or len(reply) == 10
        assert r.loss_mask.tolist() == [False] * n + [True] * (len(r.ids) - n)
        full = model.model(input_ids=r.ids[None], output_hidden_states=True)
        torch.testing.assert_close(r.final, full.last_hidden_state[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(r.stems[1], full.hidden_states[1][0], rtol=1e-4, atol=1e-4)
        argmax = model.lm_head(full.last_hidden_state[0]).argmax(-1)  # (n,)
        assert r.greedy[n - 1:].tolist() == argmax[n - 1:].tolist()  # every scored label is the target's argmax
    assert len(records[2].ids) < len(records[0].ids)  # the early stop took effect


def test_the_store_resumes_by_prompt_key_and_ignores_a_cut_index_line(tmp_path):
    model = tiny_llama(vocab=VOCAB, seed=5).model
    model.generation_config.eos_token_id = None
    tokenizer = CharTokenizer()
    prompts = [Prompt(f"p{i}", "heldout" if i < 2 else "train", ({"role": "user", "content": f"prompt {i}"},))
               for i in range(9)]
    store = ReplyStore(tmp_path)
    write_replies(model, tokenizer, prompts, store, "heldout", 0, batch=4, max_new=6, max_prompt=40, stems=[1])
    write_replies(model, tokenizer, prompts, store, "train", 31, batch=2, max_new=6, max_prompt=40, stems=[1])
    assert store.done_keys() == {"p0", "p1", "p2", "p3", "p4", "p5"}  # 15 tokens a row: the second batch passed 31
    with open(tmp_path / "index.jsonl", "a") as handle:
        handle.write('{"shard": "train-000')  # a kill cut the next line short
    again = ReplyStore(tmp_path)
    assert again.done_keys() == store.done_keys()
    write_replies(model, tokenizer, prompts, again, "train", 0, batch=2, max_new=6, max_prompt=40, stems=[1])
    keys = [k for e in ReplyStore(tmp_path).entries for k in e["keys"]]
    assert sorted(keys) == [f"p{i}" for i in range(9)] and len(keys) == 9  # nothing written twice
    train = ReplyStore(tmp_path).load("train")
    assert len(train) == 7 and all(r.loss_mask.any() for r in train)


def test_a_time_limit_stops_between_batches_and_the_folder_resumes(tmp_path, monkeypatch):
    """--max-minutes: a batch is never cut; past the deadline no new batch starts, and a later run continues."""
    from decoders.training import replies

    model = tiny_llama(vocab=VOCAB, seed=5).model
    model.generation_config.eos_token_id = None
    prompts = [Prompt(f"p{i}", "train", ({"role": "user", "content": f"prompt {i}"},)) for i in range(6)]
    store = ReplyStore(tmp_path)
    now = {"t": 0.0}
    add = store.add

    def add_then_time_passes(*args, **kwargs):  # the deadline passes while the first batch is written
        add(*args, **kwargs)
        now["t"] = 100.0

    monkeypatch.setattr(store, "add", add_then_time_passes)
    monkeypatch.setattr(replies.time, "monotonic", lambda: now["t"])
    write_replies(model, CharTokenizer(), prompts, store, "train", 0, batch=2, max_new=6, max_prompt=40, stems=[1],
                  until=50.0)
    assert store.done_keys() == {"p0", "p1"}  # one whole batch
    monkeypatch.setattr(replies.time, "monotonic", lambda: 0.0)
    write_replies(model, CharTokenizer(), prompts, ReplyStore(tmp_path), "train", 0, batch=2, max_new=6,
                  max_prompt=40, stems=[1], until=50.0)
    assert ReplyStore(tmp_path).done_keys() == {f"p{i}" for i in range(6)}


def test_held_out_prompts_are_never_training_prompts_and_skip_the_bench():
    from decoders.eagle.data import bench_source_ids
    from decoders.training.prompts import code_prompts, chat_prompts

    train, held = chat_prompts(heldout=30)
    assert len(held) == 30 and not {p.key for p in train} & {p.key for p in held}
    bench = {f"sharegpt:{i}" for i in bench_source_ids()}
    assert not bench & {p.key for p in train + held}
    code_train, code_held = code_prompts(heldout=10)
    modules = lambda ps: {p.key.split(":")[1].split(".")[0] for p in ps if p.key.startswith("stdlib:")}  # noqa
    assert code_held and not modules(code_train) & modules(code_held)  # a module is held out whole
    assert not {f"humaneval:{i}" for i in bench_source_ids()} & {p.key for p in code_train}
