"""Draft-length rules: how many tokens to draft this round, and when to stop early.

Each rule is a small object: `limit()` before a round, `check()` before every drafted position after the first,
`update()` after verification. Each returns plain dicts that land in the trace, so the UI can show the rule's
internals (entropy, bound, λ, running acceptance) without guessing. decoders/registry.py builds them from options.

A check is split in two so a chain can stay on the device (decoders/drafters/base.py): `measure(q)` takes what the
rule judges from q as a small tensor on q's device (no host read), `decide(position, values)` is the verdict from
those values once read. check() is the two in a row, so a chain that reads the measures of all its positions in one
copy at the end and decides then gets exactly the verdicts a check at each step gave.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .sampling import entropy_of


class DraftRule:
    """Interface. `check` sees the draft distribution for the next position *before* a token is drawn from it."""

    name = "rule"
    needs_distribution = False  # True: the drafter must offer a distribution (prompt lookup has none)
    prices_trees = False  # True: tree_size weighs the nodes' values against this machine's verification cost

    def limit(self) -> int:
        raise NotImplementedError

    def check(self, position: int, q: torch.Tensor) -> tuple[bool, dict]:
        """Stop before drafting `position` (1-based)? q: (V,) the distribution the rule should judge."""
        measured = self.measure(q)  # (k,) float64, or None: the rule judges nothing in q
        return self.decide(position, [] if measured is None else measured.tolist())

    def reads_at(self, position: int) -> bool:
        """Read the measures at this position's check even on an accelerator, so a stop there ends drafting at once
        (decoders/drafters/base._chain_on_device); by default they are read once, after the chain's limit."""
        return False

    def measure(self, q: torch.Tensor) -> torch.Tensor | None:
        """What `decide` needs from q (V,), as a (k,) float64 tensor on q's device, computed without a host read;
        None for a rule that never looks at q (static γ, the heuristic)."""
        return None

    def decide(self, position: int, values: list[float]) -> tuple[bool, dict]:
        """The verdict before drafting `position` from measure(q)'s values read to the host ([] if it measures
        nothing): (stop, the trace's record). Called once per position, in order, up to the first stop."""
        return False, {"position": position, "stop": False}

    def update(self, n_accepted: int, n_drafted: int) -> dict:
        """Learn from the verified round; returns the state after the update."""
        return {}

    def observe_time(self, draft_seconds: float, draft_forwards: int, verify_seconds: float, n_verified: int) -> None:
        """The round's timings, for rules that weigh cost (decoders/controller.py); others ignore them."""

    def keep_growing(self, frontier_values: list[float], pool_values: list[float], steps: int) -> bool:
        """Trees: expand the frontier once more? (values: path probabilities; the pool's best first)"""
        return True

    def tree_size(self, values: list[float], steps: int, most: int, least: int = 1) -> int:
        """Trees: how many of the pool's best nodes (values, best first) to send to the target, at most `most`
        (at least `least`: 0 lets a drafter whose draft cost nothing send no draft at all)."""
        return most

    def state(self) -> dict:
        return {}


@dataclass
class StaticRule(DraftRule):
    """Always draft γ tokens."""

    gamma: int
    name = "static"

    def limit(self) -> int:
        return self.gamma


@dataclass
class HeuristicRule(DraftRule):
    """transformers' "heuristic" schedule: +2 after a fully accepted round, −1 (not below 1) otherwise."""

    current: int
    max_draft: int
    name = "heuristic"

    def limit(self) -> int:
        return self.current

    def update(self, n_accepted: int, n_drafted: int) -> dict:
        if n_drafted > 0:  # a round cut to zero drafts by the token budget says nothing
            grown = self.current + 2 if n_accepted == n_drafted else self.current - 1
            self.current = max(1, min(self.max_draft, grown))
        return self.state()

    def state(self) -> dict:
        return {"length_after": self.current}


@dataclass
class LambdaSchedule:
    """AdaEDL's Algorithm 1 (PMLR v262): the threshold λ follows the running acceptance ratio AR.

    AR ← β1·AR + (1−β1)·n_acc/n_drafted; if AR < α: λ' = λ + ε; elif the keep condition fails: λ' = λ − ε;
    else λ' = λ; then λ ← β2·λ + (1−β2)·λ'. Keep condition: "adaedl" keeps λ when n_acc == L_max (the paper);
    "dv" keeps it when n_drafted == L_max (Draft & Verify's code). AR starts at α (the paper leaves it open).
    """

    lam: float
    max_draft: int  # L_max
    alpha: float = 0.9  # target acceptance
    beta1: float = 0.5
    beta2: float = 0.9
    eps: float = 0.01
    keep: str = "adaedl"
    ar: float | None = None

    def __post_init__(self) -> None:
        if self.ar is None:
            self.ar = self.alpha

    def update(self, n_accepted: int, n_drafted: int) -> None:
        if n_drafted == 0:  # nothing was tested: no evidence
            return
        self.ar = self.beta1 * self.ar + (1 - self.beta1) * n_accepted / n_drafted
        full = (n_accepted if self.keep == "adaedl" else n_drafted) == self.max_draft
        if self.ar < self.alpha:
            target = self.lam + self.eps  # too many rejections: stop earlier
        elif not full:
            target = self.lam - self.eps  # fine but not maxed out: allow longer drafts
        else:
            target = self.lam
        self.lam = min(1.0, max(0.0, self.beta2 * self.lam + (1 - self.beta2) * target))


@dataclass
class AdaEDLRule(DraftRule):
    """AdaEDL: stop when the entropy lower bound on acceptance, 1 − sqrt(γ·H(q)), falls below λ.

    H in nats. At temperature 0 the warped draft is one-hot (H = 0), so the drafter passes the unwarped softmax.
    γ = 0.2 and the λ-update constants are the paper's; the initial λ is not fixed by the paper (default 0.5).
    """

    schedule: LambdaSchedule
    gamma_e: float = 0.2
    name = "adaedl"
    needs_distribution = True

    def limit(self) -> int:
        return self.schedule.max_draft

    def measure(self, q: torch.Tensor) -> torch.Tensor:
        return entropy_of(q).double()[None]  # (1,) H(q) in nats

    def decide(self, position: int, values: list[float]) -> tuple[bool, dict]:
        h = values[0]
        bound = 1.0 - math.sqrt(self.gamma_e * h)
        stop = position > 1 and bound < self.schedule.lam  # the first position is always drafted
        return stop, {"position": position, "entropy": h, "bound": bound, "lam": self.schedule.lam, "stop": stop}

    def update(self, n_accepted: int, n_drafted: int) -> dict:
        self.schedule.update(n_accepted, n_drafted)
        return self.state()

    def state(self) -> dict:
        return {"lam": self.schedule.lam, "ar": self.schedule.ar}


@dataclass
class MaxConfidenceRule(DraftRule):
    """Max-Confidence-SPD (AdaEDL's baseline): stop when max_x q(x) < λ, with the same λ update as AdaEDL."""

    schedule: LambdaSchedule
    name = "max-confidence"
    needs_distribution = True

    def limit(self) -> int:
        return self.schedule.max_draft

    def measure(self, q: torch.Tensor) -> torch.Tensor:
        return q.max().double()[None]  # (1,) max_x q(x)

    def decide(self, position: int, values: list[float]) -> tuple[bool, dict]:
        confidence = values[0]
        stop = position > 1 and confidence < self.schedule.lam
        return stop, {"position": position, "confidence": confidence, "bound": confidence,
                      "lam": self.schedule.lam, "stop": stop}

    def update(self, n_accepted: int, n_drafted: int) -> dict:
        self.schedule.update(n_accepted, n_drafted)
        return self.state()

    def state(self) -> dict:
        return {"lam": self.schedule.lam, "ar": self.schedule.ar}
