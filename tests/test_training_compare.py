"""The ship rule on a tiny target: a checkpoint is exported in the shipped format and scored against the shipped
weights on the held-out replies, by α, the expected accepted chain and (EAGLE) τ of EAGLE-2, outputs unchanged."""
from __future__ import annotations

import pytest
import torch

from decoders.eagle.data import Featurized
from decoders.eagle.head import EagleHead
from decoders.eagle.official import save_official
from decoders.eagle.train import TrainSettings, acceptance_by_depth, train_head
from decoders.training.compare import compare, export_checkpoint, load_drafter, markdown, verdict
from decoders.training.prompts import Prompt
from decoders.training.replies import ReplyStore, write_replies
from test_training_replies import CharTokenizer, VOCAB
from tiny import tiny_llama


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    lm = tiny_llama(vocab=VOCAB, seed=5)
    lm.model.generation_config.eos_token_id = None
    folder = tmp_path_factory.mktemp("replies")
    store = ReplyStore(folder)
    prompts = [Prompt(f"p{i}", "heldout" if i < 4 else "train", ({"role": "user", "content": f"say {i} {i * 7}"},))
               for i in range(28)]
    for split in ("heldout", "train"):
        write_replies(lm.model, CharTokenizer(), prompts, store, split, 0, batch=8, max_new=24, max_prompt=40,
                      stems=[1], meta={"target": lm.name})
    return lm, folder


def test_a_trained_checkpoint_is_scored_as_shipped_and_beats_an_untrained_head(replies, tmp_path):
    lm, folder = replies
    store = ReplyStore(folder)
    as_f = lambda rs: [Featurized(r.ids, r.loss_mask, r.final.float()) for r in rs]  # noqa: E731
    train, held = as_f(store.load("train")), as_f(store.load("heldout"))
    torch.manual_seed(0)
    shipped = save_official(EagleHead(lm.model), tmp_path / "shipped", dtype=torch.float32)
    head = load_drafter("eagle", shipped, lm.model).train().requires_grad_(True)
    settings = TrainSettings(lr=3e-3, max_steps=60, batch_tokens=300, warmup_steps=5, eval_every_minutes=1e9)
    train_head(head, train, held, settings, log=lambda line: None, checkpoint={"path": tmp_path / "c.pt"})
    exported = export_checkpoint("eagle", tmp_path / "c.pt", lm.model, tmp_path / "out", torch.float32)
    again = load_drafter("eagle", exported, lm.model)
    assert acceptance_by_depth(again, held) == acceptance_by_depth(head.eval(), held)  # the export is the head

    record = compare("eagle", lm, folder, tmp_path / "c.pt", shipped, depths=3, decode_prompts=2, max_new=12,
                     save_dtype=torch.float32, log=lambda line: None)
    assert record["wins"], record["verdict"]
    assert record["outputs_equal"]  # greedy: the head changes the speed, never the text
    cand, ship = record["scores"]["candidate"], record["scores"]["shipped"]
    assert cand["tau"] > ship["tau"]  # tokens ÷ target forwards, the prefill forward included
    assert "| candidate |" in markdown(record) and "beats the shipped drafter" in record["verdict"]


def test_the_verdict_needs_alpha_beyond_its_noise_the_chain_and_tau():
    base = {"alpha": [0.5, 0.5], "mean_accepted": 0.8, "tau": 2.0, "chains": 2500}  # one standard error: 0.01
    assert verdict("eagle", base | {"alpha": [0.6, 0.5], "mean_accepted": 0.9}, base)[0]
    assert not verdict("eagle", base | {"alpha": [0.505, 0.5], "mean_accepted": 0.9}, base)[0]  # inside the noise
    assert verdict("eagle", base | {"alpha": [0.515, 0.5], "mean_accepted": 0.9}, base)[0]
    assert not verdict("eagle", base | {"alpha": [0.6, 0.5], "mean_accepted": 0.9, "tau": 1.9}, base)[0]
    assert not verdict("prophet", base | {"alpha": [0.6, 0.5], "mean_accepted": 0.7}, base)[0]
    assert not verdict("prophet", base | {"mean_accepted": 0.9}, base)[0]


def test_a_self_drafter_checkpoint_exports_to_the_store_format(replies, tmp_path):
    from decoders.selfdraft.heads import ExitBlock
    from decoders.selfdraft.train import exit_alpha, init_exit, train_exit
    from decoders.training import FitSettings

    lm, folder = replies
    store = ReplyStore(folder)
    train, held = store.load("train"), store.load("heldout")
    block = ExitBlock(lm.model, 1, vocab_ids=torch.arange(0, VOCAB, 2))
    init_exit(block, train)
    train_exit(block.train(), train, held, FitSettings(lr=3e-3, max_steps=10, eval_every_minutes=1e9),
               batch_tokens=300, log=lambda line: None, checkpoint={"path": tmp_path / "e.pt"})
    out = export_checkpoint("early-exit", tmp_path / "e.pt", lm.model, tmp_path / "ee", torch.float32)
    loaded = load_drafter("early-exit", out, lm.model)
    assert exit_alpha(loaded, held) == exit_alpha(block.eval(), held)
