"""Losses, batches and held-out acceptance for the early-exit block and the prophet, on the shared loop.

Both learn the target's own next-token distribution p = softmax(LMHead(f)) (soft labels over the draft
vocabulary, renormalised there), on positions whose next token lies in an assistant turn:

    L = CE(p, q) = -sum_x p(x) log q(x)

Early exit: q at position m from ExitBlock(h_k[..m]) (teacher forcing is exact here: at decode time the block
reads the real stem over the real context). Prophet: from a start t, inputs [W[f_t; E(x_{t+1})], E(x_{t+2}), ...,
E(x_{t+γ})], output i (0..γ-1) scored against p at position t+1+i.

Held-out α(d) = P(depth-d draft equals the target's argmax | depths 1..d-1 did), greedy, on data-token context.
"""
from __future__ import annotations

import random

import torch

from ..training import FitSettings, History, fit
from ..training.batches import BatchStream, RandomPicks
from ..training.checkpoint import Checkpointing
from .heads import ExitBlock, Prophet
from .record import Recorded
from .stem import causal_mask, padded_causal_mask


def soft_ce(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Masked mean of -sum p log q. logits (..., N), labels p (..., N), weight (...)."""
    ce = -(labels * torch.log_softmax(logits.float(), dim=-1)).sum(-1)  # (...)
    return (ce * weight).sum() / weight.sum().clamp_min(1.0)


def _labels(model, final: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(model.vocab(final).float(), dim=-1)  # (..., N): p over the draft vocabulary


def chain_alpha(matches: torch.Tensor, usable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """matches (S, D) bool: depth d of chain s matched; usable (S,). -> (chains reaching depth d (D+1,), chains)"""
    ok = matches[usable].long().cumprod(dim=1)  # (S', D): matched through depth d
    reached = torch.cat([torch.tensor([ok.shape[0]]), ok.sum(0)])  # (D+1,)
    return reached, ok.shape[0]


def alpha_from(reached: torch.Tensor, chains: int) -> dict:
    depths = len(reached) - 1
    alpha = [float(reached[d] / reached[d - 1]) if reached[d - 1] > 0 else 0.0 for d in range(1, depths + 1)]
    return {"alpha": alpha, "mean_accepted": float(reached[1:].sum() / max(chains, 1)), "chains": chains}


# ---------------------------------------------------------------------------------------------- initialisation

@torch.no_grad()
def lens_init(model, linear: torch.nn.Linear, inputs: torch.Tensor, wanted: torch.Tensor, ridge: float = 1e-3) -> None:
    """Fit `linear` to map inputs (T, a) to wanted (T, d) by ridge least squares; zero the layers' output projections
    (each layer starts as the identity) and set the norm's weight to wanted's RMS, so norm(linear(x)) ≈ wanted."""
    x = torch.cat([inputs.double(), torch.ones(len(inputs), 1, dtype=torch.float64)], dim=1)  # (T, a+1)
    y = wanted.double()  # (T, d)
    gram = x.T @ x  # (a+1, a+1)
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=torch.float64)
    solution = torch.linalg.solve(gram, x.T @ y)  # (a+1, d)
    linear.weight.copy_(solution[:-1].T.to(linear.weight.dtype))
    linear.bias.copy_(solution[-1].to(linear.bias.dtype))
    for layer in model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    rms = y.pow(2).mean(-1).sqrt().mean()
    model.norm.weight.fill_(float(rms))


def _sample_rows(data: list[Recorded], limit: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    rows = [(s, t) for s, r in enumerate(data) for t in range(len(r.ids) - 1)]
    return rng.sample(rows, min(limit, len(rows)))


def init_exit(block: ExitBlock, data: list[Recorded], limit: int = 20_000) -> None:
    rows = _sample_rows(data, limit)
    h = torch.stack([data[s].stems[block.exit_layer][t] for s, t in rows]).float()  # (T, d)
    f = torch.stack([data[s].final[t] for s, t in rows]).float()  # (T, d)
    lens_init(block, block.adapter, h, f)


def init_prophet(model: Prophet, data: list[Recorded], limit: int = 20_000) -> None:
    """proj([f_t ; E(x_{t+1})]) fitted to f_{t+1}: the first draft's feature."""
    rows = [(s, t) for s, t in _sample_rows(data, limit) if t + 1 < len(data[s].ids)]
    f = torch.stack([data[s].final[t] for s, t in rows]).float()  # (T, d)
    e = model.embed(torch.tensor([int(data[s].ids[t + 1]) for s, t in rows])).float()  # (T, d)
    wanted = torch.stack([data[s].final[t + 1] for s, t in rows]).float()  # (T, d)
    lens_init(model, model.proj, torch.cat([f, e], dim=1), wanted)


# ---------------------------------------------------------------------------------------------- early exit


def _collate(items: list[Recorded], key, dtype, device):
    """(inputs (B, n, d), final (B, n, d), weight (B, n), keep (B, n)) with right padding."""
    longest = max(len(r.ids) for r in items)
    d = items[0].final.shape[-1]
    inputs = torch.zeros(len(items), longest, d, dtype=dtype)
    final = torch.zeros(len(items), longest, d, dtype=dtype)
    weight = torch.zeros(len(items), longest, dtype=dtype)
    keep = torch.zeros(len(items), longest, dtype=torch.bool)
    for row, r in enumerate(items):
        n = len(r.ids)
        inputs[row, :n], final[row, :n], keep[row, :n] = key(r).to(dtype), r.final.to(dtype), True
        weight[row, : n - 1] = r.loss_mask[1:].to(dtype)  # position m predicts token m+1
    return inputs.to(device), final.to(device), weight.to(device), keep.to(device)


def exit_loss(block: ExitBlock, items: list[Recorded]) -> tuple[torch.Tensor, int]:
    device, dtype = block.norm.weight.device, block.norm.weight.dtype
    h, final, weight, keep = _collate(items, lambda r: r.stems[block.exit_layer], dtype, device)
    positions = torch.arange(h.shape[1], device=device).expand(h.shape[0], -1)  # (B, n)
    logits = block(h, positions, padded_causal_mask(keep, dtype))  # (B, n, N)
    return soft_ce(logits, _labels(block, final), weight), int(weight.sum())


@torch.no_grad()
def exit_alpha(block: ExitBlock, data: list[Recorded], depths: int = 5) -> dict:
    was = block.training
    block.eval()
    device, dtype = block.norm.weight.device, block.norm.weight.dtype
    reached, chains = torch.zeros(depths + 1), 0
    for r in data:
        n = len(r.ids)
        if n < depths + 2:
            continue
        h = r.stems[block.exit_layer].to(device, dtype)[None]  # (1, n, d)
        logits = block(h, torch.arange(n, device=device)[None], causal_mask(n, 0, dtype, device))[0]  # (n, N)
        match = (block.vocab.to_target_ids(logits.argmax(-1)).cpu() == r.greedy)  # (n,): position m predicts m+1
        valid = torch.zeros(n, dtype=torch.bool)
        valid[: n - 1] = r.loss_mask[1:]
        starts = torch.arange(n - depths)  # chains s .. s+depths-1
        grid = starts[:, None] + torch.arange(depths)[None]  # (S, D)
        got, count = chain_alpha(match[grid], valid[grid].all(1))
        reached += got
        chains += count
    block.train(was)
    return alpha_from(reached, chains)


def train_exit(block: ExitBlock, train: list[Recorded], heldout: list[Recorded], settings: FitSettings,
               batch_tokens: int = 2048, depths: int = 5, log=print, checkpoint: dict | None = None) -> History:
    """checkpoint: {"path", "every_minutes", "resume"}: the run saves (and resumes) itself there."""
    stream = BatchStream(train, batch_tokens, settings.seed)

    def step(_):
        loss, tokens = exit_loss(block, [train[i] for i in stream.next()])
        return loss, {"soft CE": loss.item()}, tokens

    block.train()
    return fit(block.parameters(), step, settings, (lambda: exit_alpha(block, heldout, depths)) if heldout else None,
               log=log, checkpointing=_checkpointing(checkpoint, block, stream))


def _checkpointing(checkpoint: dict | None, model, data) -> Checkpointing | None:
    if not checkpoint:
        return None
    meta = model.meta() | {"vocab_ids": model.vocab.vocab_ids}
    return Checkpointing(**checkpoint, parts={"model": _Trainable(model), "data": data}, kind=model.kind, meta=meta)


class _Trainable:
    """A drafter's own weights (never the target's vocabulary buffers) for the checkpoint."""

    def __init__(self, model):
        self.model = model

    def state_dict(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.trainable_state().items()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state, strict=False)


# ---------------------------------------------------------------------------------------------- prophet

def _starts(data: list[Recorded], gamma: int) -> list[tuple[int, int]]:
    """(sequence, t) for every start whose γ predicted tokens t+2..t+γ+1 exist, the first one an assistant token."""
    return [(s, t) for s, r in enumerate(data) for t in range(len(r.ids) - gamma - 1) if bool(r.loss_mask[t + 2])]


def _prophet_batch(model: Prophet, data: list[Recorded], picks: list[tuple[int, int]], gamma: int):
    """inputs (B, γ, d), labels' features (B, γ, d), greedy wanted (B, γ), weight (B, γ). Output i predicts token
    t+2+i, i.e. the target's distribution at position t+1+i."""
    device, dtype = model.proj.weight.device, model.proj.weight.dtype
    feats = torch.stack([data[s].final[t] for s, t in picks]).to(device, dtype)  # (B, d): f_t
    tokens = torch.stack([data[s].ids[t + 1 : t + 1 + gamma] for s, t in picks]).to(device)  # (B, γ): x_{t+1..t+γ}
    first = model.first_input(feats, tokens[:, 0])  # (B, d)
    inputs = torch.cat([first[:, None], model.embed(tokens[:, 1:])], dim=1)  # (B, γ, d)
    final = torch.stack([data[s].final[t + 1 : t + 1 + gamma] for s, t in picks]).to(device, dtype)  # (B, γ, d)
    wanted = torch.stack([data[s].greedy[t + 1 : t + 1 + gamma] for s, t in picks])  # (B, γ)
    weight = torch.stack([data[s].loss_mask[t + 2 : t + 2 + gamma] for s, t in picks]).to(device, dtype)  # (B, γ)
    return inputs, final, wanted, weight


def prophet_forward(model: Prophet, inputs: torch.Tensor) -> torch.Tensor:
    n = inputs.shape[1]
    positions = torch.arange(n, device=inputs.device).expand(inputs.shape[0], -1)  # (B, γ)
    return model(inputs, positions, causal_mask(n, 0, inputs.dtype, inputs.device))  # (B, γ, N)


def train_prophet(model: Prophet, train: list[Recorded], heldout: list[Recorded], settings: FitSettings,
                  gamma: int = 5, batch_tokens: int = 2048, depths: int = 5, log=print,
                  checkpoint: dict | None = None) -> History:
    starts = _starts(train, gamma)
    if not starts:
        raise ValueError(f"no training sequence is longer than γ + 2 = {gamma + 2} tokens")
    per_batch = max(1, batch_tokens // (gamma + 1))
    picker = RandomPicks(starts, settings.seed)

    def step(_):
        picks = picker.draw(per_batch)
        inputs, final, _, weight = _prophet_batch(model, train, picks, gamma)
        loss = soft_ce(prophet_forward(model, inputs), _labels(model, final), weight)
        return loss, {"soft CE": loss.item()}, int(weight.sum())

    model.train()
    return fit(model.parameters(), step, settings,
               (lambda: prophet_alpha(model, heldout, depths)) if heldout else None, log=log,
               checkpointing=_checkpointing(checkpoint, model, picker))


@torch.no_grad()
def prophet_alpha(model: Prophet, data: list[Recorded], depths: int = 5, batch: int = 512) -> dict:
    was = model.training
    model.eval()
    picks = _starts(data, depths)
    reached, chains = torch.zeros(depths + 1), 0
    for i in range(0, len(picks), batch):
        inputs, _, wanted, weight = _prophet_batch(model, data, picks[i : i + batch], depths)
        guess = model.vocab.to_target_ids(prophet_forward(model, inputs).argmax(-1)).cpu()  # (B, γ)
        got, count = chain_alpha(guess == wanted, weight.cpu().bool().all(1))
        reached += got
        chains += count
    model.train(was)
    return alpha_from(reached, chains)
