"""The shared optimisation loop. A drafter's training supplies two callables and nothing else:

    step(step_index) -> (loss tensor, {term name: float}, loss tokens in the batch)
    evaluate() -> {"alpha": [α(1), α(2), ...], ...}   (held-out acceptance by depth; optional)

so the EAGLE head, the early-exit block and the prophet differ only in their data and loss, never in how they
are optimised, timed, evaluated or logged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from .checkpoint import Checkpointing, checkpoint_state, read_checkpoint, restore, save_atomic


@dataclass(frozen=True)
class FitSettings:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 0.5  # gradient values clipped at this (EAGLE's recipe)
    warmup_steps: int = 30
    max_minutes: float = 10.0
    max_steps: int = 0  # 0 = until the time budget
    eval_every_minutes: float = 2.0
    seed: int = 0
    stop_at_step: int = 0  # end this session at this step, the schedule unchanged (a resumed run goes on)
    session_minutes: float = 0.0  # end this session after this much wall time (0: no limit); resume continues


@dataclass
class History:
    steps: int = 0
    seconds: float = 0.0
    tokens_seen: int = 0
    losses: list[tuple] = field(default_factory=list)  # (step, term 1, term 2, ...) in the order step() names them
    loss_names: list[str] = field(default_factory=list)
    evals: list[tuple[int, dict]] = field(default_factory=list)  # (step, evaluate()'s result)
    eval_seconds: list[float] = field(default_factory=list)  # training seconds when each evaluation ran


Step = Callable[[int], tuple[torch.Tensor, dict, int]]


def fit(parameters: Iterable[torch.nn.Parameter], step: Step, settings: FitSettings,
        evaluate: Callable[[], dict] | None = None, log=print, describe: Callable[[dict], str] | None = None,
        checkpointing: Checkpointing | None = None) -> History:
    """AdamW on `parameters` until the time budget (or max_steps). Evaluates every eval_every_minutes, and once at
    the end (so the last entry of history.evals is the final model).

    checkpointing: save model, optimizer, step, data position and RNG every few minutes and at the end; with
    resume=True first restore them, so that N steps in one go and N/2 + resume + N/2 train the same weights."""
    params = [p for p in parameters if p.requires_grad]
    torch.manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)
    budget = settings.max_minutes * 60
    history, done_before = History(), 0.0  # done_before: training seconds of the sessions resumed
    if checkpointing is not None and checkpointing.resume:
        saved = read_checkpoint(checkpointing.path, checkpointing.kind)
        history, done_before = restore(checkpointing, optimizer, saved)
        log(f"resumed {checkpointing.path} at step {history.steps} ({done_before / 60:.1f} min trained)")
    bar = Progress(settings.max_steps or None, initial=history.steps)
    start = last_eval = last_save = time.perf_counter()
    paused = 0.0  # evaluation and checkpoint time is not training time
    while True:
        elapsed = done_before + time.perf_counter() - start - paused
        if _finished(settings, history.steps, elapsed, budget) or _session_over(settings, history.steps, start):
            break
        _set_lr(optimizer, settings, history.steps, elapsed / budget if budget else 0.0)
        loss, terms, tokens = step(history.steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, settings.grad_clip)
        optimizer.step()
        history.steps += 1
        history.tokens_seen += int(tokens)
        history.loss_names = list(terms)
        history.losses.append((history.steps, *terms.values()))
        bar.update(" ".join(f"{k} {v:.3f}" for k, v in terms.items()))
        if evaluate and time.perf_counter() - last_eval >= settings.eval_every_minutes * 60:
            paused += _evaluate(evaluate, history, elapsed, log, describe)
            last_eval = time.perf_counter()
        if checkpointing is not None and time.perf_counter() - last_save >= checkpointing.every_minutes * 60:
            began = time.perf_counter()
            history.seconds = done_before + began - start - paused
            save_atomic(checkpoint_state(checkpointing, optimizer, history, history.seconds, settings),
                        checkpointing.path)
            last_save = time.perf_counter()
            paused += last_save - began
    history.seconds = done_before + time.perf_counter() - start - paused
    bar.close()
    if evaluate and not (history.evals and history.evals[-1][0] == history.steps):
        _evaluate(evaluate, history, history.seconds, log, describe)
    if checkpointing is not None:
        save_atomic(checkpoint_state(checkpointing, optimizer, history, history.seconds, settings), checkpointing.path)
        log(f"checkpoint {checkpointing.path} at step {history.steps}")
    return history


def _finished(settings: FitSettings, steps: int, elapsed: float, budget: float) -> bool:
    """The planned run is over: max_steps reached, or (without max_steps) the time budget spent."""
    return bool(settings.max_steps and steps >= settings.max_steps) or (not settings.max_steps and elapsed >= budget)


def _session_over(settings: FitSettings, steps: int, start: float) -> bool:
    """This session's own limit (the run itself goes on when resumed)."""
    return bool(settings.stop_at_step and steps >= settings.stop_at_step) or bool(
        settings.session_minutes and time.perf_counter() - start >= settings.session_minutes * 60)


def _evaluate(evaluate, history: History, elapsed: float, log, describe) -> float:
    began = time.perf_counter()
    result = evaluate()
    history.evals.append((history.steps, result))
    history.eval_seconds.append(elapsed)
    text = describe(result) if describe else "α by depth " + " ".join(f"{a:.2f}" for a in result.get("alpha", []))
    log(f"step {history.steps} ({elapsed / 60:.1f} min): held-out {text}")
    return time.perf_counter() - began


def _set_lr(optimizer, settings: FitSettings, step: int, progress: float) -> None:
    warm = min(1.0, (step + 1) / max(settings.warmup_steps, 1))
    decay = max(0.05, 1.0 - progress) if not settings.max_steps else max(0.05, 1.0 - step / settings.max_steps)
    for group in optimizer.param_groups:
        group["lr"] = settings.lr * warm * decay


class Progress:
    """tqdm when installed, else one printed line every 20 steps."""

    def __init__(self, total: int | None, unit: str = "step", desc: str | None = None, initial: int = 0):
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, mininterval=2.0, initial=initial)
        except ImportError:
            self._bar = None
        self._count = initial

    def update(self, text: str = "", n: int = 1) -> None:
        self._count += n
        if self._bar is not None:
            self._bar.update(n)
            if text:
                self._bar.set_postfix_str(text, refresh=False)
        elif text and self._count % 20 == 0:
            print(f"step {self._count}: {text}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
