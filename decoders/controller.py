"""The draft controller: each round, draft as much as this machine can verify profitably.

For a chain, the cap L on this round's drafts maximises the expected committed tokens per unit of time,

    gain(L) = E(L) / (L·c + t(L + 1)),    E(L) = 1 + Σ_{k ≤ L} α_1 ··· α_k

with the measured verification cost t(n)/t(1) of this machine (decoders/costs.py) in place of Leviathan's t = 1
(Sequoia's hardware-aware form), c = one draft step / one target step, and α_k the chance the target accepts the
draft at depth k once it accepted those above it. With one α for every depth this is Leviathan et al. 2023's
E(L) = (1 − α^(L+1)) / (1 − α) (Thm 3.8); acceptance is not i.i.d., though: on code a draft that survived its first
tokens is copying a line the target writes too, so deep positions are taken far more often than the first (the
cross-tokenizer SmolLM2 → Qwen-1.5B runs: α ≈ 0.75 overall, caps of 2, τ 3.0, where AdaEDL's own L_max 8 accepted
whole rounds of 7 to 8 drafts, τ 6.0). gain(0) = 1 is the baseline, so the controller drafts nothing when nothing
pays. The draft-length rule it wraps (AdaEDL, max-confidence) still judges every position inside the cap, but its
stop is priced: the rule's bound with its constant λ says whether a token is doubtful, and the controller stops at a
doubtful position only when drafting it does not pay: its distribution is already computed, so the token costs only
t(k+1) − t(k), and below the cap one more draft forward c, which buys the next token with chance α_(k+1); drafting
on pays when reach·a_doubt·(1 + α_(k+1)) ≥ rate·(c + t(k+2) − t(k)) (at the cap: reach·a_doubt ≥ rate·(t(k+1) −
t(k))). reach, the chance the drafts before it are accepted; a_doubt, how often the target accepted doubtful drafts
in this run; rate, the expected tokens per unit cost of the chosen cap (TreeCostRule.keep_growing's test, token by
token).
Why: on the Qwen pair's chat prompts the cap was 3.6 on average after the warm-up, yet AdaEDL at λ 0.5 (its λ
moves by at most 0.001 a round) stopped 15 of 21 rounds inside it (1.5 drafts a round), 12 of those fully
accepted, and along the greedy output the target accepted 64% of the draft's tokens whose bound was below λ: far
above the ~45% at which a draft token paid on that machine. AdaEDL's bound is a lower bound on acceptance, and
at temperature 0 a pair trained alike agrees on the argmax more often than the draft's entropy suggests.

The cap is a plan from average acceptance; past it a round drafts on (up to MAX_CAP) while the inner rule is sure of
each position and a sure token pays by the same test with a_sure for a_doubt; doubt past the cap ends the round.
Why (SmolLM2 drafting for Qwen-1.5B): caps settled at 2 while the draft copied whole lines, its next token sure, where
AdaEDL's own L_max 8 drafted and got 8 (τ 4.8 against 3.0); with the extension τ on those prompts rose to 3.7 / 5.3 /
2.2 (from 3.0 / 4.4 / 1.9). The forward a stop past the cap wastes is priced in the previous position's next term.
Tried, not kept: planning only depths the run has tested (the cross-tokenizer code rows lost τ; headline 0.93× UAG).

α and c are running estimates, so the controller follows the text (code: long caps; chat: short ones) and the
machine (a costlier verification: shorter caps):
- α: acceptances S and rejections F, decayed by `decay` per tested position, from a weak prior; a round that
  stopped by its rule or its cap without a rejection adds no failure. α = S / (S + F) is the MLE of a geometric
  acceptance run. α_k: the same decayed counts per class of depths (1, 2, 3, 4, 5-6, 7-8, 9-12, 13-16, 17+; a
  class decays when one of its positions is tested), each shrunk by two pseudo-positions toward the class above it
  (depth 1 toward α), so a depth seen rarely reads what the depths above it read, and before any round the curve
  is Leviathan's.
- c: seconds per draft forward over seconds per target step, where a target step = verification seconds / t(n) of
  that round's n; an exponential moving average of the rounds' own timings (the loop reports them; its draft lap
  times drafting alone, not the previous round's recording or this round's limit()).
- early exit verifies over layers k+1..L only: its verification of n tokens costs 1 + s·(t(n) − 1) target steps,
  s = (L − k)/L (`verify_share`; the root's stem, k layers, runs in the draft phase), and a round's own target
  step is read from its verification seconds / (s·t(n)).
- a_doubt (and a_sure): the same decayed counts per drafted position, split by the inner rule's verdict on it: a
  position counts once tested (accepted, or the first rejected one). Position 1 is always drafted, so doubtful
  positions are tested even while every stop is kept.
When the best cap is 0 (the baseline wins), the controller still drafts one token now and then (a probe): a run that
never drafts would never learn that α or c had changed. A probe costs c + t(2) − t(1) target steps, so probes come
every `probe interval` rounds without a tested draft, where the interval spends at most PROBE_SHARE of those rounds'
time on probing (at most `probe_every` rounds). Why: in 4 of 4 float32 Races the copy task's prompt lookup drafted
15 tokens of chat-template text in round 1, all rejected; α fell below t(2) − 1 of a curve cached on a busy
machine, the cap went to 0, and with a fixed probe every 8 rounds, that reset even when a probe found no n-gram to
draft, the run kept cap 0 in 14 of 18 rounds on text it then copied (τ 1.11). Prompt lookup's probe costs only
t(2) − t(1), so it now probes about every round until a tested draft lifts α again.
Every round's decision (cap, best, probe, why, α, c) goes into the trace (RoundRecord.rule["controller"], kept with
recording off; the whole gain curve with recording on).

Reproducibility: the caps follow the run's own wall-clock timings (c, and a cost curve measured on this machine), so
two runs with the same seed at temperature > 0 can draft different lengths, consume their random draws in another
order and sample different (equally valid) outputs; greedy output does not depend on the caps. For a reproducible
sampled run, use a fixed rule (static γ, AdaEDL with a fixed L_max) instead of controller "cost".
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .rules import DraftRule

MAX_CAP = 32  # longest chain the controller considers (the verification curve is measured up to 64)
PROBE_SHARE = 0.1  # at most this share of the undrafted rounds' time goes to probing (see the module docstring)
# A controlled tree's bounds: it grows up to D steps of K children and sends up to M nodes, less wherever the frontier
# or the verification cost says more would not pay (the Race's and bench's cost-aware tree presets use these). D 16:
# at D 8 every round on the Qwen pair's code prompts accepted all 8 levels (the bound, not the controller, stopped
# it, τ 6.9 against transformers' 16 at 20 tokens); the growth test still stops shallow trees where drafts miss.
TREE_BOUNDS = dict(tree_k=4, tree_depth=16, tree_m=32)


@dataclass
class AcceptanceEstimate:
    """α from decayed counts of accepted drafts (S) and rejections (F), with a prior of `strength` pseudo-rounds.

    The counts decay by `decay` per drafted position tested (accepted, or the first rejected), not per round, so the
    memory holds about as many tokens whatever the rounds' lengths. Decayed per round, short rounds forgot after a
    few tokens: on chat one rejection pulled α down, the cap shrank, the rounds got shorter and carried less evidence
    still (measured: caps of 2 to 3 on an α swinging 0.5 to 0.9, where 4 drafts a round paid best). The prior 0.75
    is about the pair's overall acceptance on the bench's prompts (chat 0.8, code 0.95 and up): the first rounds
    draft 2 or 3 tokens rather than 1. The memory is about ten tested tokens (decay 0.9): at 0.8 (five) the Qwen
    pair's chat runs swung α between 0.40 and 0.97 within four rounds, and each rejection cut the next caps to 1 or
    2 on text where static γ 4 accepted all four drafts in most rounds (its acceptance by depth 0.80 / 0.71 / 0.81 /
    0.85: a steady 0.8, not the swings)."""

    prior: float = 0.75
    strength: float = 2.0
    decay: float = 0.9
    successes: float = field(init=False)
    failures: float = field(init=False)
    by_depth: list = field(init=False)  # DepthCounts per class of DEPTH_CLASSES (acceptance once those above are taken)

    def __post_init__(self) -> None:
        self.successes, self.failures = self.prior * self.strength, (1 - self.prior) * self.strength
        self.by_depth = [DepthCounts() for _ in range(len(DEPTH_CLASSES) + 1)]

    @property
    def alpha(self) -> float:
        return self.successes / (self.successes + self.failures)

    def update(self, n_accepted: int, n_drafted: int) -> None:
        if n_drafted == 0:
            return
        weight = self.decay ** min(n_accepted + 1, n_drafted)  # one decay per tested position
        self.successes = weight * self.successes + n_accepted
        self.failures = weight * self.failures + (1.0 if n_accepted < n_drafted else 0.0)
        tested = min(n_accepted + 1, n_drafted)
        for k in range(tested):  # positions 1..n_accepted taken, the next one missed
            self.by_depth[_depth_class(k + 1)].add(k < n_accepted, self.decay)
        for counts in self.by_depth[_depth_class(tested) + 1:]:  # classes this round never reached
            counts.age(weight)

    def rates(self, most: int) -> list[float]:
        """The chance the target accepts the draft at depth k = 1..most once it accepted those above it: each
        depth class's decayed counts, shrunk by `strength` pseudo-positions toward the class above it (depth 1:
        toward the overall α). Classes a round does not reach age by that round's weight, so one old miss at depth
        7 fades while rounds capped at 6 keep being taken, and the cap tries 7 again (measured, SmolLM2 drafting
        for Qwen-1.5B on code editing: without aging, one miss at depth 7 held the caps at 6 for eight fully
        accepted rounds, where AdaEDL's L_max 8 kept drafting 8). A class with few tested positions reads about
        what the depths above it read: a run
        whose rounds are all taken at cap 2 prices depth 3 like depth 2, not like the overall α that the first
        rounds' misses pulled down (measured, Qwen-1.5B code editing: with depth 3 priced at α the caps stayed at
        2 for nine rounds of fully accepted drafts, τ 2.67 against AdaEDL L_max 8's 4.36)."""
        by_class, above = [], self.alpha
        for counts in self.by_depth:
            above = counts.rate(above, self.strength)
            by_class.append(above)
        return [by_class[_depth_class(k)] for k in range(1, most + 1)]


DEPTH_CLASSES = (1, 2, 3, 4, 6, 8, 12, 16)  # draft depths 1 | 2 | 3 | 4 | 5-6 | 7-8 | 9-12 | 13-16 | 17 and up


def _depth_class(depth: int) -> int:
    return bisect.bisect_left(DEPTH_CLASSES, depth)


@dataclass
class DepthCounts:
    """Decayed accepted / tested counts of one class of draft depths (decayed each time the class is tested)."""

    accepted: float = 0.0
    tested: float = 0.0

    def add(self, accepted: bool, decay: float) -> None:
        self.accepted = decay * self.accepted + accepted
        self.tested = decay * self.tested + 1.0

    def age(self, weight: float) -> None:
        """A round that did not reach this class: its evidence gets older all the same (see AcceptanceEstimate)."""
        self.accepted *= weight
        self.tested *= weight

    def rate(self, prior: float, strength: float) -> float:
        return (self.accepted + prior * strength) / (self.tested + strength)


@dataclass
class PositionRate:
    """How often the target accepts one class of drafted positions: decayed accepted / tested counts, with a prior
    of `strength` positions. A position is tested when it is accepted or is the round's first rejection."""

    prior: float = 0.5
    strength: float = 2.0
    decay: float = 0.8
    accepted: float = field(init=False)
    tested: float = field(init=False)

    def __post_init__(self) -> None:
        self.accepted, self.tested = self.prior * self.strength, self.strength

    @property
    def rate(self) -> float:
        return self.accepted / self.tested

    def decay_round(self) -> None:
        self.accepted *= self.decay
        self.tested *= self.decay

    def add(self, accepted: bool) -> None:
        self.accepted += 1.0 if accepted else 0.0
        self.tested += 1.0


def gain_curve(alpha: float | list[float], c: float, t: Callable[[int], float], max_cap: int) -> list[float]:
    """gain(L) for L = 0..max_cap: expected tokens per unit of time (one target step = 1). alpha: one acceptance
    for every depth (Leviathan's i.i.d. model), or the chance at each depth 1..max_cap given the ones above were
    accepted: E(L) = 1 + Σ_{k ≤ L} Π_{j ≤ k} α_j (the same sum when every α_j is α)."""
    rates = [alpha] * max_cap if isinstance(alpha, (int, float)) else list(alpha)
    expected, reach, out = 1.0, 1.0, [1.0 / t(1)]
    for length in range(1, max_cap + 1):
        reach *= rates[length - 1]
        expected += reach
        out.append(expected / (length * c + t(length + 1)))
    return out


@dataclass
class CostAwareRule(DraftRule):
    """A draft-length rule whose cap is chosen each round by expected gain; `inner` still judges every position."""

    inner: DraftRule
    t: Callable[[int], float]  # t(n)/t(1) of the target's chain verification on this machine
    c: float  # prior for the draft step cost, before the run has timed its own
    max_cap: int = MAX_CAP
    estimate: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    verify_share: float = 1.0  # of a full target forward, what the drafter's verification runs (early exit: (L−k)/L)
    c_decay: float = 0.7
    probe_every: int = 8  # the longest interval between probes
    last: dict = field(default_factory=dict)  # the latest decision, for the trace
    rounds_without_draft: int = 0  # rounds since a drafted token was last tested (a cap with no match teaches nothing)
    doubtful: PositionRate = field(default_factory=PositionRate)  # positions the inner rule would have stopped at
    sure: PositionRate = field(default_factory=lambda: PositionRate(prior=0.8))  # the others
    verdicts: list[bool] = field(default_factory=list)  # this round's drafted positions: doubtful?
    overruled: int = 0  # this round's inner stops the controller found worth drafting through
    extend: bool = True  # past the cap, draft on while the inner rule is sure and a sure token pays (see limit())
    extended: int = 0  # this round's positions drafted past the cap

    @property
    def name(self) -> str:  # the trace keeps the inner rule's name: its panel draws the inner rule's checks
        return self.inner.name

    @property
    def needs_distribution(self) -> bool:
        return self.inner.needs_distribution

    def cost_t(self, n: int) -> float:
        """Target steps to verify n tokens: t(n), or for a drafter that verifies part of the forward (early exit)
        one step plus its share of the growth (its k stem layers ran for the root in the draft phase)."""
        return 1.0 + self.verify_share * (self.t(n) - 1.0)

    def probe_interval(self) -> int:
        """Rounds without a tested draft before a probe: a probe's cost in target steps over PROBE_SHARE."""
        cost = self.c + self.cost_t(2) - self.cost_t(1)
        return max(1, min(self.probe_every, math.ceil(cost / PROBE_SHARE - 1e-9)))

    def limit(self) -> int:
        rates = self.estimate.rates(self.max_cap)
        curve = gain_curve(rates, self.c, self.cost_t, self.max_cap)
        best = max(range(len(curve)), key=lambda length: (curve[length], -length))  # ties: the shorter cap
        interval = self.probe_interval()
        probe = best == 0 and self.rounds_without_draft + 1 >= interval
        cap = 1 if probe else best
        why = "gain" if best else "probe" if probe else "nothing pays"
        bound = self.max_cap if self.extend and best > 0 and self.inner.needs_distribution else cap
        self.verdicts, self.overruled, self.extended = [], 0, 0
        self.last = {"cap": cap, "bound": bound, "best": best, "probe": probe, "why": why,
                     "alpha": self.estimate.alpha, "c": self.c,
                     "rounds_without_draft": self.rounds_without_draft, "probe_interval": interval,
                     "gain": curve, "t": [self.cost_t(n) for n in range(1, self.max_cap + 2)], "by_depth": rates,
                     "a_doubt": self.doubtful.rate, "a_sure": self.sure.rate}
        schedule = getattr(self.inner, "schedule", None)
        if schedule is not None:  # AdaEDL's λ keeps still when a round fills its cap: this round's cap is L_max
            schedule.max_draft = max(cap, 1)
        return bound

    def reads_at(self, position: int) -> bool:
        """Past its cap the round drafts on up to MAX_CAP while each position pays, and stops where one does not,
        usually a few positions on: a device chain that read once after its limit would run every one of those
        forwards, so past the cap the measures are read at each check (up to the cap they wait: the plan)."""
        cap = self.last.get("cap", 0)
        return position > cap and self.last.get("bound", 0) > cap

    def measure(self, q: torch.Tensor) -> torch.Tensor | None:
        return self.inner.measure(q)

    def decide(self, position: int, values: list[float]) -> tuple[bool, dict]:
        stop, record = self.inner.decide(position, values)
        bound, lam = record.get("bound"), record.get("lam")
        doubtful = stop or (bound is not None and lam is not None and bound < lam)  # position 1: what it would say
        if position > self.last.get("cap", position):  # past the plan: only a sure token that pays
            worth, price = self._marginal(position, doubtful)
            stop = doubtful or worth < price
            record = {**record, "stop": stop, "worth": worth, "price": price, "past_cap": True}
            self.extended += 0 if stop else 1
        elif stop:
            worth, price = self._marginal(position, doubtful)
            stop = worth < price
            record = {**record, "stop": stop, "worth": worth, "price": price}
            self.overruled += 0 if stop else 1
        if not stop:
            self.verdicts.append(doubtful)
        return stop, record

    def _marginal(self, position: int, doubtful: bool = True) -> tuple[float, float]:
        """What drafting `position` is worth and costs, in expected tokens and target steps, for a position the
        inner rule doubts (inside the cap) or is sure of (past it).

        Its distribution is already paid for (the check reads it), so the token itself costs only its verification,
        t(k+1) − t(k); below the round's bound, drafting it also pays c for the next position's forward, which buys
        that position's token with chance α at the next depth. It pays when tokens per step beat the chosen cap's
        rate. A position's chance once those above it are taken: a sure one's at least its depth's α_k and a_sure,
        a doubtful one's at most both. Why: a_sure alone reads a line's missed first token as doubt about its
        eighth (code editing: rounds stopped sure at the cap where AdaEDL's L_max 8 took 8 of 8)."""
        chance = [min(a, self.doubtful.rate) if doubt else max(a, self.sure.rate)
                  for a, doubt in zip(self.last["by_depth"], self.verdicts + [doubtful])]
        token = math.prod(chance)  # reach (the drafts above taken) times this position's own chance
        worth, steps = token, self.cost_t(position + 1) - self.cost_t(position)
        if position < self.last.get("bound", self.last.get("cap", position)):
            worth += token * self.last["by_depth"][position]  # the next position's chance, once this one is taken
            steps += self.c + self.cost_t(position + 2) - self.cost_t(position + 1)
        rate = self.last["gain"][self.last["cap"]] if self.last else 1.0
        return worth, rate * steps

    def update(self, n_accepted: int, n_drafted: int) -> dict:
        self.estimate.update(n_accepted, n_drafted)
        self.rounds_without_draft = 0 if n_drafted else self.rounds_without_draft + 1
        if n_drafted > 0:
            for rate in (self.doubtful, self.sure):
                rate.decay_round()
            for k, doubtful in enumerate(self.verdicts[: n_accepted + 1]):  # the accepted and the first rejected
                (self.doubtful if doubtful else self.sure).add(k < n_accepted)
        inner = self.inner.update(n_accepted, n_drafted)
        return {**inner, "controller": {**self.last, "overruled": self.overruled, "extended": self.extended}}

    def observe_time(self, draft_seconds: float, draft_forwards: int, verify_seconds: float, n_verified: int) -> None:
        """The round's own timings: a draft forward's seconds over a target step's (verify seconds / its share of
        t(n))."""
        if draft_forwards <= 0 or verify_seconds <= 0:
            return
        step = verify_seconds / (self.verify_share * self.t(n_verified))
        measured = (draft_seconds / draft_forwards) / step
        self.c = self.c_decay * self.c + (1 - self.c_decay) * measured

    def state(self) -> dict:
        return self.inner.state()


@dataclass
class TreeCostRule(DraftRule):
    """The controller for trees (EAGLE-2 / DDD shapes): grow while the frontier can still pay for a draft step, then
    send the M best nodes that maximise expected tokens per unit cost.

    A node's value v (the product of draft probabilities on its path) estimates the chance the target accepts the
    path to it, so sending the M most valuable nodes is expected to yield 1 + κ·Σ_{i≤M} v_i tokens, κ a running
    calibration (accepted ÷ predicted: a draft's probabilities are over- or under-confident), at a cost of
    steps·c + t_tree(M + 1) target steps. Before each expansion step, growing pays only if the most it can add,
    κ·Σ_frontier v (a child's value is at most its parent's), beats the best rate so far times the step's cost c:
    DDD's confidence test with a threshold taken from this machine's costs instead of a constant.
    """

    t: Callable[[int], float]  # t(n)/t(1) of the target's tree-mask verification
    c: float  # seconds of one draft forward over a frontier / one target step (a prior; the run times its own)
    steps: int  # most expansion steps (the shape's D or n)
    kappa: float = 1.0
    kappa_decay: float = 0.7
    learn_kappa: bool = True  # False: the drafter calibrates its values itself (suffix decoding, by match length)
    c_decay: float = 0.7
    last: dict = field(default_factory=dict)
    name = "static"  # the tree's own rule name in traces (its depth bound); the decisions go under "controller"
    prices_trees = True

    def limit(self) -> int:
        self.last = {}  # a round cut short by the token budget grows nothing and decides nothing
        return self.steps

    def _rates(self, values: list[float], steps: int, most: int) -> list[float]:
        """Expected tokens per unit cost for M = 1..most (index M - 1); values best first."""
        total, rates = 1.0, []
        for m in range(1, most + 1):
            total += self.kappa * values[m - 1]
            rates.append(total / (steps * self.c + self.t(m + 1)))
        return rates

    def keep_growing(self, frontier_values: list[float], pool_values: list[float], steps: int) -> bool:
        best = max(self._rates(pool_values, steps, len(pool_values)), default=1.0)
        return self.kappa * sum(frontier_values) > best * self.c

    def tree_size(self, values: list[float], steps: int, most: int, least: int = 1) -> int:
        """M in least..most with the best rate; M = 0 (least 0) is the baseline's step: no draft sent."""
        gain = [1.0 / (steps * self.c + 1.0)] + self._rates(values, steps, most)  # gain[M], M = 0..most
        m = max(range(least, most + 1), key=lambda i: (gain[i], -i), default=least)  # ties: the smaller tree
        self.last = {"m": m, "of": most, "steps": steps, "kappa": self.kappa, "c": self.c, "gain": gain,
                     "predicted": self.kappa * sum(values[:m]),
                     "calibrated_by": "rule" if self.learn_kappa else "drafter"}
        return m

    def probe(self, value: float) -> int:
        """Send one node although none pays (a drafter's probe, drafters/suffix.py): recorded as such."""
        self.last = {**self.last, "m": 1, "probe": True, "predicted": self.kappa * value}
        return 1

    def observe_time(self, draft_seconds: float, draft_forwards: int, verify_seconds: float, n_verified: int) -> None:
        if draft_forwards <= 0 or verify_seconds <= 0:
            return
        step = verify_seconds / self.t(n_verified)
        self.c = self.c_decay * self.c + (1 - self.c_decay) * (draft_seconds / draft_forwards) / step

    def update(self, n_accepted: int, n_drafted: int) -> dict:
        predicted = self.last.get("predicted", 0.0) / max(self.kappa, 1e-9)  # the uncalibrated Σ v of what was sent
        if self.learn_kappa and n_drafted > 0 and predicted > 0:
            ratio = min(max(n_accepted / predicted, 0.05), 20.0)
            self.kappa = self.kappa_decay * self.kappa + (1 - self.kappa_decay) * ratio
        return {"controller": {**self.last, "cap": self.last["m"]}} if self.last else {}
