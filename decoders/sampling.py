"""Logits -> probabilities, shared by the target (p) and every drafter (q).

Both sides must use the identical warp: "lossless" always means "exactly the warped target distribution".
Temperature 0 means greedy: the warped distribution is one-hot at the argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Warp:
    """Temperature, top-k and top-p (nucleus) applied in that order, like transformers' warpers."""

    temperature: float = 0.0  # 0 = greedy; 1.0 = the model's own distribution
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped next-token distribution. logits: (..., V) -> probs (..., V), float32, rows sum to 1."""
        logits = logits.float()  # (..., V)
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()  # (..., V)
        logits = logits / self.temperature  # (..., V)
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]  # (..., 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))  # (..., V)
        if self.top_p < 1.0:
            logits = _nucleus(logits, self.top_p)  # (..., V)
        return torch.softmax(logits, dim=-1)  # (..., V)


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches top_p (always at least one)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)  # (..., V)
    drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before this token already enough
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # (..., V) back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def raw_probs(logits: torch.Tensor) -> torch.Tensor:
    """Unwarped softmax (temperature 1). Used for display and for entropy rules at temperature 0."""
    return torch.softmax(logits.float(), dim=-1)


def seeded_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """The run's one random stream, on the device of the tensors it samples from.

    PyTorch refuses a CPU generator for CUDA probabilities, so the generator follows the model. On the CPU this is
    the same stream as torch.Generator().manual_seed(seed): recorded CPU traces replay unchanged.
    """
    return torch.Generator(device=device).manual_seed(seed)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a (V,) distribution with the run's generator (both on the same device)."""
    return int(draw(probs, generator))


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """sample() left on the device: the (1,) token id, not read (a chain feeds it to its next step); the same
    multinomial call, so the same random stream."""
    return torch.multinomial(probs, 1, generator=generator)


def uniform(generator: torch.Generator) -> float:
    """One U(0,1) draw from the run's generator (recorded in the trace), made on the generator's device."""
    return float(torch.rand((), generator=generator, device=generator.device))


def entropy(probs: torch.Tensor) -> float:
    """Shannon entropy in nats of a (V,) distribution."""
    return float(entropy_of(probs))


def entropy_of(probs: torch.Tensor) -> torch.Tensor:
    """entropy() left on the distribution's device: a () tensor, no host read (a chain's rule measures it per
    position and reads every position's at once)."""
    logp = torch.log(probs.clamp_min(1e-30))  # (V,)
    return -(probs * logp).sum()  # ()
