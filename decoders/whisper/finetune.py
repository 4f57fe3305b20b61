"""Fine-tuning Whisper's text decoder on (audio, transcript) pairs: full fine-tuning or LoRA, in a few functions.

LoRA (Hu et al. 2021) comes from peft, the library Whisper fine-tuning recipes use: a frozen base linear W plus a
low-rank update (alpha/r)·B·A on the attention query and value projections (self and cross attention), B starting
at zero so step 0 is exactly the base model; merge_lora folds the update into W for decoding. Training adapts the
decoder only; the encoder is frozen and its features are computed once per clip (on a CPU the encoder's 30 s
window costs far more than the decoder). Used by bench/whisper_finetune.py.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # cross_entropy's ignore_index: padding in the targets


def add_lora(model, rank: int = 8, alpha: float = 16.0, targets=("query", "value")) -> list[nn.Parameter]:
    """Give `model.decoder` peft LoRA adapters on every attention's `targets` projections (model.decoder becomes a
    peft PeftModel around the TextDecoder; every base weight is frozen); returns the trainable LoRA parameters."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {rank}")
    model.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")
    model.decoder = get_peft_model(model.decoder, config)
    return [p for p in model.decoder.parameters() if p.requires_grad]


def merge_lora(model):
    """Fold the adapters into the base weights (W + (alpha/r)·B·A) and put the plain TextDecoder back; returns
    `model`. Decoding (whisper's kv-cache hooks) then sees ordinary linears."""
    from peft import PeftModel

    if isinstance(model.decoder, PeftModel):
        model.decoder = model.decoder.merge_and_unload()
    return model


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
