"""The drafter interface (transformers' candidate generator, reduced to what the loop needs).

propose(ids, limit, ...) -> Proposal   a draft tree rooted at the pending token ids[-1], at most `limit` drafts
observe(n_before, n_accepted, path=, features=)
                                       after verification: roll the drafter's own state back to what was kept;
                                       path = the accepted node ids (which branch of a tree won), features = the
                                       target's last hidden states (N+1, H) when wants_target_hidden
score(target, tree, hidden)            the verification forward (default: target.forward_tree)
use_kv(plan)                           keep the drafter's own KV cache as the run's plan says (static buffers)
close()                                free caches; called from the loop's `finally`, also on cancel
start(ids, features=) / start_steps(...)  the prompt is known: prefill the drafter's own state (in steps the loop
                                       can stop between: a draft model reads a long prompt in chunks)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Iterator

import torch

from ..rules import DraftRule
from ..sampling import Warp, draw, raw_probs, sample
from ..tree import DraftTree
from . import device_tree


class DraftStop(StrEnum):
    """Why drafting stopped this round (the trace's rule.reason)."""

    LIMIT = "limit"  # the round's limit (the rule's length, or the tree's shape)
    RULE = "rule"  # the rule judged the next position not worth drafting (AdaEDL, max-confidence, DDD)
    BUDGET = "budget"  # max_new_tokens leaves no room for more drafts
    NO_MATCH = "no-match"  # prompt lookup found no earlier occurrence to copy
    EOS = "eos"  # a copied end-of-sequence token ends the draft
    MID_CHARACTER = "mid-character"  # the committed text ends inside a character: no whole text to re-tokenize
    NONE = "none"  # nothing was drafted (limit 0)


@dataclass
class Proposal:
    tree: DraftTree
    forwards: int = 0  # draft forward passes spent this round
    checks: list[dict] = field(default_factory=list)  # the draft-length rule's per-position records
    reason: DraftStop = DraftStop.LIMIT  # why drafting stopped
    search: dict | None = None  # tree drafters: the candidate pool, reranked set and stop checks (trace.py)
    retokenized: dict | None = None  # a draft with its own tokenizer: both tokenizations of the round (trace.py)


class Drafter:
    name = "drafter"
    offers_distribution = True  # False for copy-based drafters (their candidates are deterministic)
    # True: the loop asks the target forward for its top hidden states and passes them back; a tuple of layer
    # indices: those layers' hidden states, concatenated (EAGLE-3; decoders/runtime/features.pick_features)
    wants_target_hidden: bool | tuple[int, ...] = False

    def start(self, ids: list[int], features: torch.Tensor | None = None) -> None:
        """The prompt is known (ids[-1] is the pending token); prefill any state of the drafter's own.

        features: (len(ids) - 1, H) the target's last hidden states over the prefill, only when wants_target_hidden.
        """

    def start_steps(self, ids: list[int], features: torch.Tensor | None = None) -> Iterator[int]:
        """start() in steps the loop can stop between (a draft model reading a long prompt takes minutes on a CPU),
        yielding the prompt tokens read so far after each. Default: start() in one step, nothing to yield."""
        if features is None:
            self.start(ids)
        else:
            self.start(ids, features=features)
        yield from ()

    def propose(self, ids: list[int], limit: int, rule: DraftRule, warp: Warp, generator: torch.Generator,
                record: bool) -> Proposal:
        raise NotImplementedError

    def observe(self, n_before: int, n_accepted: int, path: list[int] | None = None,
                features: torch.Tensor | None = None) -> None:
        """ids had n_before tokens when the round began; the first n_accepted drafts were kept.

        path: the accepted node ids, root excluded (a chain's is 1..n_accepted); features: (N+1, H) target hidden
        states of every node, given only to a drafter that sets wants_target_hidden.
        """

    def score(self, target, tree: DraftTree, hidden: bool | tuple[int, ...]):
        """The verification forward: (logits (N+1, V), hidden states (N+1, H) (or the layers `hidden` names,
        concatenated) or None). A drafter that already ran part of the target for its nodes (early exit's shared
        layers) overrides this to run only the rest."""
        if hidden:
            return target.forward_tree(tree, hidden=hidden)
        return target.forward_tree(tree), None

    def summary(self) -> dict:
        """Facts about the drafter's shape and work for the trace's totals (e.g. early exit's layer k); {} if none."""
        return {}

    def kv_peak_bytes(self) -> int:
        """The most KV memory the drafter's own cache held (a draft model's, an EAGLE head's); 0 for none."""
        return 0

    def use_kv(self, plan) -> None:
        """Before the run: keep the drafter's own KV cache as `plan` (decoders/runtime/buffers.KVPlan) says. A drafter with
        a cache of its own (a draft model, an EAGLE head) remakes it; the others have nothing to do."""

    def runtime(self) -> dict:
        """How the drafter's own forwards ran, for the trace (Trace.runtime): {"draft": runner.runtime()} for a
        drafter with a runner of its own, {} otherwise."""
        return {}

    def close(self) -> None:
        """Release caches."""


class ReadsPrompt:
    """Mixin for a drafter with a draft model of its own (`self.runner`, a CachedModel): it reads the prompt but the
    pending last token (which propose feeds) in prefill chunks, as the target does."""

    def start_steps(self, ids: list[int], features=None) -> Iterator[int]:
        for read, _ in self.runner.prefill(ids[:-1]):
            yield read

    def start(self, ids: list[int], features=None) -> None:
        for _ in self.start_steps(ids):
            pass


class NoDraft(Drafter):
    """The autoregressive baseline: no draft, so every round is one plain target step."""

    name = "none"

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        return Proposal(DraftTree.root_only(ids[-1]), reason=DraftStop.NONE)


def draft_chain(step: Callable[[list[int]], torch.Tensor], first: list[int], limit: int, rule: DraftRule,
                warp: Warp, generator: torch.Generator, record: bool, tensors: bool = False) -> Proposal:
    """Draft up to `limit` tokens one at a time from a model-like `step(tokens) -> next logits (V,)`.

    The rule judges the distribution for position j before a token is drawn from it; at temperature 0 it judges
    the unwarped softmax (the warped one is one-hot, entropy 0, and would never stop). Returns a chain tree whose
    node i's children were drawn from q_dists[i] (WITH_REPLACEMENT: one i.i.d. sample per position).
    tensors: `step` also takes a (1,) device tensor of the last token; then the chain stays on the device and is
    read once (_chain_on_device).
    """
    tree = DraftTree.root_only(first[-1])
    proposal = Proposal(tree, reason=DraftStop.LIMIT)
    if limit <= 0:
        proposal.reason = DraftStop.BUDGET
        return proposal
    if tensors:
        return _chain_on_device(proposal, step, first, limit, rule, warp, generator, record)
    logits = step(first)  # (V,) for draft position 1
    proposal.forwards = 1
    for position in range(1, limit + 1):
        token = draft_position(proposal, position, logits, rule, warp, generator, record)
        if token is None:
            break
        if position < limit:
            logits = step([token])  # (V,) for the next position
            proposal.forwards += 1
    return proposal


def _chain_on_device(proposal: Proposal, step, first: list[int], limit: int, rule: DraftRule | None, warp: Warp,
                     generator: torch.Generator, record: bool) -> Proposal:
    """A chain whose tokens never leave the device until one read: each argmax (or draw(): sample()'s multinomial
    call, not read, so the same random stream) feeds the next step as a (1,) tensor, its q row stays on the device
    for verification, and the rule's measures of every position (rules.DraftRule.measure) come back in the same
    copy, where its verdicts are decided in order, as a check at each step would have (the same tokens, checks, q).

    The rule's stop, as device_tree.py's DDD stop: on an accelerator the steps run up to the limit (the host cannot
    stop them without waiting) and the positions after the first stop are dropped when read, their forwards still
    counted (a drafter with state of its own trims what they fed); on a device in STOPS_READ_ON (the CPU, where a
    read waits for nothing), and at the positions a rule reads_at (the controller past its cap), the measures are
    read at the check and drafting stops there, as the host chain did (drafts past a stop are drawn there too: a
    sampled run's later draws shift, each still a fresh draw, so it stays lossless; on the CPU it draws exactly
    what the host chain drew)."""
    tokens, shown, qs = [], [], []  # per position: (1,) token, (1,) q of it, (V,) q (sampled) or None
    logits = step(first)  # (V,) for draft position 1
    proposal.forwards = 1
    verdicts = _Verdicts(rule, at_every_check=logits.device.type in device_tree.STOPS_READ_ON)
    for position in range(1, limit + 1):
        q = None if warp.greedy else warp.probs(logits)  # (V,) the distribution a sampled draft is drawn from
        judged = q if q is not None else raw_probs(logits) if record or rule is not None else None  # (V,) greedy: raw
        if verdicts.judge(position, judged):
            break
        token = logits.argmax(-1, keepdim=True) if q is None else draw(q, generator)  # (1,)
        tokens.append(token)
        qs.append(q)
        if record:
            shown.append(judged[token])  # (1,)
        if position < limit:
            logits = step(token)  # (V,) for the next position
            proposal.forwards += 1
    host = torch.cat([t.double() for t in tokens + shown + verdicts.pending]).cpu().tolist()  # the drafter's one read
    n = len(tokens)
    drafted, q_token = host[:n], host[n:2 * n] if record else [None] * n
    verdicts.finish(n, host[(2 if record else 1) * n:])
    for position, (stop, check) in enumerate(verdicts.decided, start=1):  # in order, up to the first stop
        if record:
            proposal.checks.append(check)
        if stop:
            proposal.reason = DraftStop.RULE
            break
        node = proposal.tree.add(position - 1, int(drafted[position - 1]), q_token[position - 1])
        if qs[position - 1] is not None:
            proposal.tree.q_dists[node - 1] = qs[position - 1]  # children of node-1 were drawn from q
    return proposal


class _Verdicts:
    """A device chain's rule verdicts, position by position in order: each position's measures wait on the device
    until a read decides them (a check that reads, or the chain's one read at the end); a rule with state (the cost
    controller) decides each position once, in order, and none after its first stop."""

    def __init__(self, rule: DraftRule | None, at_every_check: bool):
        self.rule, self.at_every_check = rule, at_every_check
        self.pending: list[torch.Tensor] = []  # (k,) float64 measures of the positions not decided yet
        self.decided: list[tuple[bool, dict]] = []  # (stop, the trace's record) of positions 1, 2, ...

    def judge(self, position: int, judged: torch.Tensor | None) -> bool:
        """Measure `position` (before its token is drawn); read and decide what waits if this check reads. True: a
        decided position stopped the chain."""
        measure = self.rule.measure(judged) if self.rule is not None else None  # (k,) or None: judges nothing
        if measure is None:
            return False
        self.pending.append(measure)
        if not (self.at_every_check or self.rule.reads_at(position)):
            return False
        values = torch.cat(self.pending).tolist()  # one read at this check
        self.pending = []
        self._decide(values, len(values) // measure.shape[0])
        return self.stopped

    def finish(self, drafted: int, values: list[float]) -> None:
        """After the one read: decide the positions still waiting (a rule that measures nothing decides from no
        values), up to `drafted` and the one after it, where a stop may wait."""
        if not self.stopped:
            self._decide(values, len(self.pending) or max(0, drafted - len(self.decided)))

    @property
    def stopped(self) -> bool:
        return bool(self.decided) and self.decided[-1][0]

    def _decide(self, values: list[float], count: int) -> None:
        k = len(values) // count if count else 0
        for i in range(count):
            position = len(self.decided) + 1
            verdict = (self.rule.decide(position, values[i * k:(i + 1) * k]) if self.rule is not None
                       else (False, {"position": position, "stop": False}))
            self.decided.append(verdict)
            if verdict[0]:
                return


def draft_position(proposal: Proposal, position: int, logits: torch.Tensor, rule: DraftRule, warp: Warp,
                   generator: torch.Generator, record: bool) -> int | None:
    """One drafted position: the rule judges, then a token is drawn and added. Returns it, or None if the rule
    stopped (the batched drafters, decoders/batch/drafters.py, call this same body row by row)."""
    q = warp.probs(logits)  # (V,) the distribution the draft token is drawn from
    judged = raw_probs(logits) if warp.greedy and (record or rule.needs_distribution) else q  # (V,)
    stop, check = rule.check(position, judged)
    if record:
        proposal.checks.append(check)
    if stop:
        proposal.reason = DraftStop.RULE
        return None
    token = int(logits.argmax()) if warp.greedy else sample(q, generator)
    node = proposal.tree.add(position - 1, token, float(judged[token]) if record else None)
    if not warp.greedy:
        proposal.tree.q_dists[node - 1] = q  # children of node-1 were drawn from q
    return token
