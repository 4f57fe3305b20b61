"""Fine-tuning Whisper's text decoder on (audio, transcript) pairs: full fine-tuning or LoRA, in a few functions.

peft is not a dependency, so LoRA is written out here (Hu et al. 2021): a frozen base linear W plus a low-rank
update scale·B·A on the attention query and value projections (the paper's and peft's usual targets), B starting
at zero so step 0 is exactly the base model. Training adapts the decoder only; the encoder is frozen and its
features are computed once per clip (on a CPU the encoder's 30 s window costs far more than the decoder).
Used by bench/whisper_finetune.py.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # cross_entropy's ignore_index: padding in the targets


class LoRALinear(nn.Module):
    """base(x) + scale * x·Aᵀ·Bᵀ with base frozen; A: (rank, in), B: (out, rank), B = 0 at the start."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # peft's choice for A
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = (x @ self.lora_a.T.to(x.dtype)) @ self.lora_b.T.to(x.dtype)  # (..., out)
        return self.base(x) + self.scale * update

    def merged(self) -> nn.Linear:
        """A plain linear with W + scale·B·A: same outputs, no wrapper left for decoding."""
        merged = self.base
        with torch.no_grad():
            merged.weight += self.scale * (self.lora_b @ self.lora_a)  # (out, in)
        return merged


def add_lora(module: nn.Module, rank: int = 8, alpha: float = 16.0, targets=("query", "value")) -> list[nn.Parameter]:
    """Freeze every weight of `module`, wrap each attention's `targets` projections; returns the LoRA parameters."""
    from whisper.model import MultiHeadAttention

    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {rank}")
    module.requires_grad_(False)
    params = []
    for attention in [m for m in module.modules() if isinstance(m, MultiHeadAttention)]:
        for name in targets:
            wrapped = LoRALinear(getattr(attention, name), rank, alpha)
            setattr(attention, name, wrapped)
            params += [wrapped.lora_a, wrapped.lora_b]
    return params


def merge_lora(module: nn.Module) -> nn.Module:
    """Replace every LoRALinear in `module` by its merged linear (in place); returns `module`."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, name, child.merged())
    return module


@dataclass(frozen=True)
class Example:
    features: torch.Tensor  # (n_audio_ctx, d): the frozen encoder's output for one clip
    tokens: tuple[int, ...]  # prompt (sot, language, task, notimestamps) + text + eot


def encode(model, mel: torch.Tensor) -> torch.Tensor:
    """(n_mels, frames) -> (n_audio_ctx, d), no gradient (the encoder stays frozen)."""
    with torch.no_grad():
        return model.encoder(mel[None])[0]


def batch(examples: list[Example], prompt_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """features (B, n_audio_ctx, d), inputs (B, T), targets (B, T): predict every token after the prompt."""
    length = max(len(e.tokens) for e in examples) - 1
    inputs = torch.zeros(len(examples), length, dtype=torch.long)  # pad with 0: masked out of the loss
    targets = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    for row, example in enumerate(examples):
        ids = torch.tensor(example.tokens)
        inputs[row, :len(ids) - 1] = ids[:-1]
        targets[row, prompt_len - 1:len(ids) - 1] = ids[prompt_len:]  # the prompt itself is given, not learned
    return torch.stack([e.features for e in examples]), inputs, targets


def loss_on(model, examples: list[Example], prompt_len: int) -> torch.Tensor:
    """Mean token cross-entropy of the text decoder on `examples` (teacher forcing)."""
    features, inputs, targets = batch(examples, prompt_len)
    logits = model.decoder(inputs, features)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


def train(model, params: list[nn.Parameter], examples: list[Example], prompt_len: int, steps: int, lr: float,
          batch_size: int = 8, seed: int = 0) -> list[float]:
    """AdamW on `params` for `steps` minibatches (shuffled epochs, fixed seed); returns the loss per step."""
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    order, losses, rng = [], [], random.Random(seed)
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        chosen, order = order[:batch_size], order[batch_size:]
        loss = loss_on(model, [examples[i] for i in chosen], prompt_len)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def trainable_count(params: list[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)
