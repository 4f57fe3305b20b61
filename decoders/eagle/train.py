"""Training an EAGLE head on the target's own features (Li et al. 2024; SafeAILab/EAGLE eagle/train/main.py).

One draft step at data position i reads (t_{i+1}, f_i) and predicts the next feature and the token after it:

    L = v_w * SmoothL1(g_i, f_{i+1}) + p_w * CE(p_{i+2}, q_{i+2}),   v_w = 1.0, p_w = 0.1 (EAGLE's weights)

with p_{i+2} = softmax(LMHead(f_{i+1})), the target's own next-token distribution (soft labels, not data tokens),
both terms averaged over the positions whose feature f_{i+1} lies in an assistant turn. Input features get EAGLE's
uniform noise, amplitude std * 512 / n (±0.1 at n = 512 with std 0.2). AdamW (betas 0.9, 0.95), gradient values
clipped at 0.5, linear warm-up then linear decay over the time budget (EAGLE decays over 20 epochs; a CPU run has
minutes, so the schedule is in seconds): the shared loop of every learned drafter, decoders/training.

Held-out acceptance by depth (`acceptance_by_depth`) drafts exactly as at decode time, all positions at once: depth
k feeds the head its own depth k-1 feature, and a depth-k query attends the real keys up to where its chain began
plus one drafted key per earlier depth (the ancestors it would have in a chain), never keys that a real draft
would not have. Tokens fed are the data tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from ..training import FitSettings, History, fit
from ..training.batches import BatchStream
from ..training.checkpoint import Checkpointing
from .data import Featurized
from .head import EagleHead, causal_mask
from .head3 import Eagle3Head


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 1e-3  # far above EAGLE's 3e-5: minutes on a CPU, not 20 epochs on GPUs
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    v_w: float = 1.0  # feature regression weight (EAGLE)
    p_w: float = 0.1  # token classification weight (EAGLE)
    noise_std: float = 0.2  # EAGLE's uniform input-feature noise
    grad_clip: float = 0.5  # EAGLE clips gradient values
    warmup_steps: int = 30
    batch_tokens: int = 2048
    max_minutes: float = 10.0
    max_steps: int = 0  # 0 = until the time budget
    eval_every_minutes: float = 2.0
    depths: int = 5
    seed: int = 0
    ttt_depths: int = 1  # training-time test: also train on the head's own drafted features, this deep
    stop_at_step: int = 0  # end this session here (loop.FitSettings)
    session_minutes: float = 0.0


@dataclass
class Batch:
    ids: torch.Tensor  # (B, n)
    features: torch.Tensor  # (B, n, d), EAGLE-3: (B, n, 3d) fused
    mask: torch.Tensor  # (B, n) bool: real assistant positions
    final: torch.Tensor | None = None  # (B, n, d) the top feature, when `features` is not it

    @property
    def top(self) -> torch.Tensor:
        return self.features if self.final is None else self.final


# ---------------------------------------------------------------------------------------------- batches


def collate(examples: list[Featurized], device, dtype) -> Batch:
    longest = max(len(e.ids) for e in examples)
    width, d = examples[0].features.shape[-1], examples[0].top.shape[-1]
    fused = examples[0].final is not None  # EAGLE-3: the fused features and the top feature, both
    ids = torch.zeros(len(examples), longest, dtype=torch.long)  # (B, n)
    feats = torch.zeros(len(examples), longest, width, dtype=dtype)  # (B, n, d or 3d)
    final = torch.zeros(len(examples), longest, d, dtype=dtype) if fused else None  # (B, n, d)
    mask = torch.zeros(len(examples), longest, dtype=torch.bool)  # (B, n)
    for row, e in enumerate(examples):
        n = len(e.ids)
        ids[row, :n], feats[row, :n], mask[row, :n] = e.ids, e.features.to(dtype), e.loss_mask
        if fused:
            final[row, :n] = e.final.to(dtype)
    return Batch(ids.to(device), feats.to(device), mask.to(device), final.to(device) if fused else None)


# ---------------------------------------------------------------------------------------------- the loss

def target_probs(head: EagleHead | Eagle3Head, features: torch.Tensor) -> torch.Tensor:
    """p = softmax(LMHead(f)) over the head's vocabulary (renormalised there when reduced). (B, n, d) -> (B, n, V|N)"""
    with torch.no_grad():
        return torch.softmax(head.label_logits(features).float(), dim=-1)  # (B, n, V|N)


def loss_terms(head: EagleHead | Eagle3Head, batch: Batch, noise_std: float = 0.0,
               depths: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(regression, classification) losses of one batch, each a masked mean over predicted positions.

    depths > 1 is training-time test (EAGLE-3; HASS's harmonised context): after the teacher-forced step the head
    runs again on its OWN features, exactly as it drafts (depth k at position m reads its depth k-1 output at m-1 and
    attends the real keys up to where its chain began plus one drafted key per earlier depth: depth_mask), and each
    depth is scored against the same targets (the prediction at m always stands in for f_{m+1}); the terms are
    averaged over depths. Gradients flow through the drafted features, as in EAGLE-3.

    An EAGLE-3 head (head3.py) reads fused features through its fc (`lift`, so that later depths can put its own
    d-wide outputs in their place) and has no regression term (its g is not trained to be f_{i+1}): 0 here."""
    if noise_std > 0:  # EAGLE's noise on the target features, before any fc
        noisy = batch.features[:, :-1]
        noisy = noisy + (torch.rand_like(noisy) - 0.5) * noise_std * 512 / noisy.shape[1]
        inputs = head.lift(noisy)  # (B, n-1, d): f_i, or fc(fused_i)
    else:
        inputs = head.lift(batch.features[:, :-1])  # (B, n-1, d)
    tokens = batch.ids[:, 1:]  # (B, n-1): t_{i+1}
    wanted = batch.top[:, 1:]  # (B, n-1, d): f_{i+1}
    p = target_probs(head, wanted)  # (B, n-1, V|N): p_{i+2}
    n = inputs.shape[1]
    cache = DynamicCache(config=head.config) if depths > 1 else None
    positions = torch.arange(n, device=inputs.device).expand(inputs.shape[0], n) if depths > 1 else None
    regression = classification = 0.0
    for depth in range(1, depths + 1):
        mask = depth_mask(n, depth, inputs.dtype, inputs.device) if depths > 1 else None
        predicted = head.features(tokens, inputs, positions, cache, mask)  # (B, n-1, d): g_i, standing in for f_{i+1}
        weight = batch.mask[:, 1:].to(predicted.dtype)  # (B, n-1)
        weight[:, : depth - 1] = 0  # positions before a depth-`depth` chain can start
        count = weight.sum().clamp_min(1.0)
        reg = (nn.functional.smooth_l1_loss(predicted, wanted, reduction="none").mean(-1) if head.predicts_features
               else torch.zeros_like(weight))  # (B, n-1)
        log_q = torch.log_softmax(head.logits(predicted).float(), dim=-1)  # (B, n-1, V|N)
        regression = regression + (reg * weight).sum() / count
        classification = classification + (-(p * log_q).sum(-1) * weight).sum() / count
        inputs = torch.cat([inputs[:, :1], predicted[:, :-1]], dim=1)  # position m reads its own g_{m-1}
    return regression / depths, classification / depths


# ---------------------------------------------------------------------------------------------- acceptance

@torch.no_grad()
def acceptance_by_depth(head: EagleHead | Eagle3Head, examples: list[Featurized], depths: int = 5,
                        top_k: tuple[int, ...] = (1, 4, 10)) -> dict:
    """Greedy acceptance α(k) = P(step k matches the target's argmax | steps 1..k-1 matched), on held-out text.

    Also top-k recall at depth 1 (the target's argmax among the head's k best tokens) and the mean accepted chain
    length if the head drafted `depths` tokens (τ - 1). Returns {"alpha": [...], "recall": {k: r}, ...}.
    """
    was_training = head.training
    head.eval()
    device, dtype = head.fc.weight.device, head.fc.weight.dtype
    reached = torch.zeros(depths + 1)  # chains that matched through depth k (index 0: all chains)
    recall_hits = {k: 0 for k in top_k}
    chains = 0
    for example in examples:
        n = len(example.ids) - 1  # predicted positions 0..n-1
        if n < depths + 1:
            continue
        feats = example.features.to(device, dtype)[None]  # (1, n+1, d or 3d)
        ids = example.ids.to(device)[None]  # (1, n+1)
        top = example.top.to(device, dtype)  # (n+1, d)
        wanted = head.target_logits(top[1:]).argmax(-1)  # (n,): the target's argmax after position m+1
        valid = example.loss_mask[1:].to(device)  # (n,): step at m predicts inside an assistant turn
        cache = DynamicCache(config=head.config)
        positions = torch.arange(n, device=device)[None]  # (1, n)
        inputs = head.lift(feats[:, :-1])  # (1, n, d): depth 1 reads the real features
        match = []
        for depth in range(1, depths + 1):
            mask = depth_mask(n, depth, dtype, device)  # (1, 1, n, depth * n)
            hidden, logits = head(ids[:, 1:], inputs, positions, cache, mask)  # (1, n, d), (1, n, V|N)
            guess = head.to_target_ids(logits.argmax(-1))[0]  # (n,)
            match.append((guess == wanted) & valid)  # (n,): step `depth` of the chain ending at m
            if depth == 1:
                ranked = head.to_target_ids(logits[0].topk(min(max(top_k), logits.shape[-1]), -1).indices)  # (n, K)
                for k in top_k:
                    recall_hits[k] += int(((ranked[:, :k] == wanted[:, None]).any(-1) & valid).sum())
            inputs = torch.cat([inputs[:, :1], hidden[:, :-1]], dim=1)  # (1, n, d): position m reads g_{m-1}
        starts = torch.arange(n - depths + 1, device=device)  # chains i .. i+depths-1 that fit
        ok = torch.ones(len(starts), dtype=torch.bool, device=device)
        usable = torch.stack([valid[starts + d] for d in range(depths)]).all(0)  # (S,): the whole chain is assistant
        chains += int(usable.sum())
        reached[0] += int(usable.sum())
        for depth in range(1, depths + 1):
            ok = ok & match[depth - 1][starts + depth - 1]  # (S,)
            reached[depth] += int((ok & usable).sum())
    head.train(was_training)
    alpha = [float(reached[k] / reached[k - 1]) if reached[k - 1] > 0 else 0.0 for k in range(1, depths + 1)]
    return {"alpha": alpha, "recall": {k: recall_hits[k] / max(chains, 1) for k in top_k},
            "mean_accepted": float(reached[1:].sum() / max(chains, 1)), "chains": chains}


def depth_mask(n: int, depth: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, n, depth * n): query m of depth k sees real keys j <= m-k+1 and drafted key m-(k-d) of depth d."""
    allowed = torch.zeros(n, depth * n, dtype=torch.bool, device=device)  # (n, depth * n)
    rows = torch.arange(n, device=device)
    allowed[:, :n] = torch.ones(n, n, dtype=torch.bool, device=device).tril(diagonal=-(depth - 1))
    for d in range(2, depth + 1):
        cols = rows - (depth - d)
        ok = cols >= 0
        allowed[rows[ok], (d - 1) * n + cols[ok]] = True
    if depth == 1:
        return causal_mask(n, 0, dtype, device)
    mask = torch.zeros(n, depth * n, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


# ---------------------------------------------------------------------------------------------- the loop

def train_head(head: EagleHead | Eagle3Head, train: list[Featurized], heldout: list[Featurized],
               settings: TrainSettings,
               log=print, checkpoint: dict | None = None) -> History:
    """The shared loop (decoders/training) on the EAGLE loss; evaluates on `heldout` as it goes and at the end.

    checkpoint: {"path", "every_minutes", "resume"} (decoders/training/checkpoint.py): the head, the optimizer and
    the batch stream's position are saved there, and restored first when resume is true."""
    stream = BatchStream(train, settings.batch_tokens, settings.seed)
    device, dtype = head.fc.weight.device, head.fc.weight.dtype

    def step(_):
        batch = collate([train[i] for i in stream.next()], device, dtype)
        regression, classification = loss_terms(head, batch, settings.noise_std, settings.ttt_depths)
        loss = settings.v_w * regression + settings.p_w * classification
        return loss, {"regression": regression.item(), "classification": classification.item()}, int(batch.mask.sum())

    fit_settings = FitSettings(lr=settings.lr, weight_decay=settings.weight_decay, betas=settings.betas,
                               grad_clip=settings.grad_clip, warmup_steps=settings.warmup_steps,
                               max_minutes=settings.max_minutes, max_steps=settings.max_steps,
                               eval_every_minutes=settings.eval_every_minutes, seed=settings.seed,
                               stop_at_step=settings.stop_at_step, session_minutes=settings.session_minutes)
    head.train()
    evaluate = (lambda: acceptance_by_depth(head, heldout, settings.depths)) if heldout else None
    meta = {"vocab_ids": head.vocab_ids, "bias": head.fc.bias is not None}
    if head.arch == "eagle3":  # what rebuilds it (training/compare.export_checkpoint); its own kind: never resumed
        meta = {"vocab_ids": head.draft_ids, "feature_layers": head.feature_layers}  # as the other architecture
    saving = Checkpointing(**checkpoint, parts={"model": head, "data": stream}, kind=checkpoint_kind(head), meta=meta) \
        if checkpoint else None
    return fit(head.parameters(), step, fit_settings, evaluate, log, describe=_describe, checkpointing=saving)


def checkpoint_kind(head) -> str:
    return "eagle" if head.arch == "eagle1" else "eagle3"


def _describe(result: dict) -> str:
    return ("α by depth " + " ".join(f"{a:.2f}" for a in result["alpha"])
            + " | top-1/4/10 recall " + "/".join(f"{r:.2f}" for r in result["recall"].values()))
