"""Resumable training: N steps in one go train the same weights as N/2, a checkpoint, a resume and N/2 more; a run
killed mid-flight resumes from its last checkpoint; a checkpoint is replaced atomically."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from decoders.eagle.data import Example, target_features
from decoders.eagle.head import EagleHead
from decoders.eagle.train import TrainSettings, train_head
from decoders.training.checkpoint import CheckpointError, read_checkpoint
from tiny import tiny_llama

VOCAB = 48
TESTS = Path(__file__).resolve().parent


def corpus(count: int, length: int, seed: int) -> list[Example]:
    generator = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(99)) * 3, -1)
    examples = []
    for i in range(count):
        n = length - (i % 5)  # unequal lengths: batches of several sizes
        ids = [int(torch.randint(0, VOCAB, (1,), generator=generator))]
        for _ in range(n - 1):
            ids.append(int(torch.multinomial(transitions[ids[-1]], 1, generator=generator)))
        mask = torch.ones(n, dtype=torch.bool)
        mask[:3] = False
        examples.append(Example(torch.tensor(ids), mask))
    return examples


def setup(seed: int = 3):
    torch.set_num_threads(1)
    target = tiny_llama(vocab=VOCAB, seed=seed).model
    train = target_features(target, corpus(24, 30, seed=1), store_dtype=torch.float32)
    heldout = target_features(target, corpus(6, 30, seed=2), store_dtype=torch.float32)
    torch.manual_seed(7)
    head = EagleHead(target, vocab_ids=torch.arange(0, VOCAB, 2))  # a reduced vocabulary travels in the checkpoint
    return target, head, train, heldout


def settings(**changes) -> TrainSettings:
    base = dict(lr=3e-3, max_steps=40, batch_tokens=150, warmup_steps=5, eval_every_minutes=1e9, noise_std=0.2)
    return TrainSettings(**(base | changes))


def test_half_checkpoint_resume_half_equals_one_run(tmp_path):
    _, straight, train, heldout = setup()
    whole = train_head(straight, train, heldout, settings(), log=lambda line: None)

    _, first, train, heldout = setup()
    ckpt = {"path": tmp_path / "run.pt", "every_minutes": 1e9}
    half = train_head(first, train, heldout, settings(stop_at_step=20), log=lambda line: None, checkpoint=ckpt)
    assert half.steps == 20 and read_checkpoint(tmp_path / "run.pt", "eagle")["history"].steps == 20

    _, resumed, train, heldout = setup()  # a fresh process: fresh head (other init), fresh data order
    torch.manual_seed(12345)  # and a different global RNG: the checkpoint's RNG must win
    rest = train_head(resumed, train, heldout, settings(), log=lambda line: None, checkpoint=ckpt | {"resume": True})
    assert rest.steps == whole.steps == 40
    assert [round(x, 5) for row in rest.losses for x in row] == [round(x, 5) for row in whole.losses for x in row]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert rest.evals[-1][1]["alpha"] == pytest.approx(whole.evals[-1][1]["alpha"])


def test_resume_without_a_checkpoint_says_what_to_do(tmp_path):
    _, head, train, heldout = setup()
    with pytest.raises(CheckpointError, match="start without --resume"):
        train_head(head, train, heldout, settings(), checkpoint={"path": tmp_path / "none.pt", "resume": True})


def test_an_interrupted_write_leaves_the_last_checkpoint_whole(tmp_path):
    _, head, train, heldout = setup()
    path = tmp_path / "run.pt"
    train_head(head, train, heldout, settings(stop_at_step=5), log=lambda line: None, checkpoint={"path": path})
    (tmp_path / "run.pt.tmp").write_bytes(b"half a checkpoint")  # a write that a kill cut short
    assert read_checkpoint(path)["history"].steps == 5


KILLED_RUN = """
import sys, time, torch
sys.path.insert(0, {tests!r})
import test_training_resume as t
_, head, train, heldout = t.setup()
import decoders.eagle.train as tr
original = tr.loss_terms
def slow(*args, **kwargs):
    time.sleep(0.05)  # slow enough to be killed mid-run
    return original(*args, **kwargs)
tr.loss_terms = slow
tr.train_head(head, train, heldout, t.settings(max_steps=400), log=print,
              checkpoint={{"path": {path!r}, "every_minutes": 0.0}})
"""


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    path = tmp_path / "run.pt"
    script = KILLED_RUN.format(tests=str(TESTS), path=str(path))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(TESTS.parent))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (path.is_file() and _steps(path) >= 10):
            time.sleep(0.2)
            assert proc.poll() is None, "the run ended before it was killed"
        os.killpg(proc.pid, signal.SIGKILL)  # no clean exit: no final checkpoint
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    saved = _steps(path)
    assert 10 <= saved < 400
    _, head, train, heldout = setup()
    history = train_head(head, train, heldout, settings(max_steps=saved + 5), log=lambda line: None,
                         checkpoint={"path": path, "resume": True})
    assert history.steps == saved + 5 and len(history.losses) == saved + 5  # the killed run's losses are kept
    assert read_checkpoint(path)["history"].steps == saved + 5


def _steps(path: Path) -> int:
    try:
        return read_checkpoint(path)["history"].steps
    except CheckpointError:
        return 0


def selfdraft_setup(kind: str):
    from decoders.selfdraft.heads import ExitBlock, Prophet
    from decoders.selfdraft.record import record
    from decoders.selfdraft.train import init_exit, init_prophet

    torch.set_num_threads(1)
    target = tiny_llama(vocab=VOCAB, seed=2, layers=4, scale=0.6).model
    data = record(target, corpus(20, 30, seed=4), [2], store_dtype=torch.float32)
    train, held = data[4:], data[:4]
    if kind == "early-exit":
        model = ExitBlock(target, 2, vocab_ids=torch.arange(0, VOCAB, 2))
        init_exit(model, train)
    else:
        model = Prophet(target, 1, vocab_ids=torch.arange(0, VOCAB, 2))
        init_prophet(model, train)
    return model.train().requires_grad_(True), train, held


@pytest.mark.parametrize("kind", ["early-exit", "prophet"])
def test_self_drafters_resume_to_the_same_weights(tmp_path, kind):
    from decoders.selfdraft.train import train_exit, train_prophet
    from decoders.training import FitSettings

    trainer = train_exit if kind == "early-exit" else train_prophet
    fit = lambda **c: FitSettings(**(dict(lr=3e-3, max_steps=16, warmup_steps=3, eval_every_minutes=1e9) | c))  # noqa
    straight, train, held = selfdraft_setup(kind)
    whole = trainer(straight, train, held, fit(), batch_tokens=120, log=lambda line: None)
    first, train, held = selfdraft_setup(kind)
    ckpt = {"path": tmp_path / "run.pt"}
    trainer(first, train, held, fit(stop_at_step=8), batch_tokens=120, log=lambda line: None, checkpoint=ckpt)
    assert read_checkpoint(tmp_path / "run.pt", kind)["meta"]["kind"] == kind
    resumed, train, held = selfdraft_setup(kind)
    with torch.no_grad():
        for p in resumed.parameters():
            p.add_(0.01)  # a different start: the checkpoint's weights must win
    rest = trainer(resumed, train, held, fit(), batch_tokens=120, log=lambda line: None,
                   checkpoint=ckpt | {"resume": True})
    assert [round(x, 5) for row in rest.losses for x in row] == [round(x, 5) for row in whole.losses for x in row]
    for (name, a), (_, b) in zip(straight.trainable_state().items(), resumed.trainable_state().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
