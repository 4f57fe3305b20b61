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
        evaluate: Callable[[], dict] | None = None, log=print, describe: Callable[[dict], str] | None = None) -> History:
    """AdamW on `parameters` until the time budget (or max_steps). Evaluates every eval_every_minutes, and once at
    the end (so the last entry of history.evals is the final model)."""
    params = [p for p in parameters if p.requires_grad]
    torch.manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)
    budget = settings.max_minutes * 60
    history = History()
    bar = Progress(settings.max_steps or None)
    start = last_eval = time.perf_counter()
    paused = 0.0  # evaluation time is not training time
    while True:
        elapsed = time.perf_counter() - start - paused
        if (settings.max_steps and history.steps >= settings.max_steps) or (not settings.max_steps and elapsed >= budget):
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
    history.seconds = time.perf_counter() - start - paused
    bar.close()
    if evaluate:
        _evaluate(evaluate, history, history.seconds, log, describe)
    return history


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

    def __init__(self, total: int | None, unit: str = "step", desc: str | None = None):
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, mininterval=2.0)
        except ImportError:
            self._bar = None
        self._count = 0

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
