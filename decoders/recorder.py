"""Builds the trace while the loop runs. With record=False: counters, ids, timings and each round's rule decision."""
from __future__ import annotations

import time
from typing import Callable

import torch

from .drafters import Proposal
from .readout import RoundReadout
from .stats import summarize
from .trace import NodeRecord, RoundRecord, TokenRecord, Trace
from .tree import depths
from .verify import Verdict

PROVENANCE_OF_SOURCE = {"bonus": "bonus", "resampled": "resampled", "baseline": "baseline"}


class Detokenizer:
    """Per-token text that concatenates to the decoded output, even when a character spans several tokens.

    Each token is decoded together with the previous ones (vLLM's prefix/read offsets), so tokenizers that drop
    a leading space at the start of a decode still give the right piece. A token that ends inside a multi-byte
    character gets "" and the token that completes it carries the whole character.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] is context whose text was already handed out
        self.read_offset = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text of trailing tokens that never completed a character."""
        return self._advance(final=True) if self.read_offset < len(self.ids) else ""

    def _advance(self, final: bool) -> str:
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.decode(self.ids[self.prefix_offset:])
        if not final and (full.endswith("\ufffd") or not full.startswith(prefix)):
            return ""  # wait: the last token ends inside a character
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix):]


class TraceBuilder:
    def __init__(self, trace: Trace, decode: Callable[[list[int]], str], record: bool):
        self.trace = trace
        self.decode = decode
        self.record = record
        self.detok = Detokenizer(decode)
        self.seconds = 0.0  # the recorder's own work (totals["record_seconds"]): what recording costs a run
        self.extra_totals: dict = {}  # what the run's set-up adds to the totals (the controller's cost curve)

    def add_round(self, *args, **kwargs) -> RoundRecord:
        """Append one round (see _add_round), timing the recorder's own work."""
        start = time.perf_counter()
        try:
            return self._add_round(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def _add_round(self, proposal: Proposal, verdict: Verdict, committed: list[int], readout: RoundReadout,
                   rule_after: dict, rule_name: str | None, limit: int, seconds: dict) -> RoundRecord:
        """Append one round; `readout` is what the round read of the target's output (decoders/readout.py)."""
        index = len(self.trace.rounds)
        provenance = ["accepted"] * (len(committed) - 1) + [PROVENANCE_OF_SOURCE[verdict.source]]
        if len(committed) <= verdict.n_accepted:  # cut at an accepted EOS: every kept token was a draft
            provenance = ["accepted"] * len(committed)
        rnd = RoundRecord(index=index, n_drafted=proposal.tree.n_drafted, n_accepted=verdict.n_accepted,
                          committed=list(committed), provenance=provenance, bonus_token=verdict.token,
                          bonus_text="", bonus_source=verdict.source, target_forwards=1,
                          draft_forwards=proposal.forwards, seconds=seconds)
        if self.record:
            rnd.bonus_text = self.decode([verdict.token])
            rnd.nodes = self._nodes(proposal, verdict, readout.shown)
            rnd.search = self._search(proposal.search)
            rnd.retokenized = proposal.retokenized
            if rule_name is not None:
                rnd.rule = {"name": rule_name, "limit": limit, "reason": proposal.reason, "checks": proposal.checks,
                            **rule_after}
        elif rule_name is not None:  # why a round drafted what it did, even unrecorded: the Race's verdicts read it
            rnd.rule = {"name": rule_name, "limit": limit, "reason": proposal.reason, "checks": [],
                        **_decision(rule_after)}
        self.trace.rounds.append(rnd)
        self._add_tokens(committed, provenance, index, readout.top_of(([0] + verdict.path)[:len(committed)]))
        return rnd

    def _search(self, search: dict | None) -> dict | None:
        """The tree search with each candidate's text, so the page can show what was grown but never sent."""
        if not search:
            return search
        texts = {"match_texts": [self.decode([t]) for t in search["match"]]} if "match" in search else {}
        return {**search, **texts, "pool": [{**entry, "text": self.decode([entry["token"]])} for entry in search["pool"]]}

    def _add_tokens(self, committed: list[int], provenance: list[str], index: int, top: list[list]) -> None:
        for token, source, best in zip(committed, provenance, top):
            self.trace.output_ids.append(token)
            text = self.detok.push(token) if self.record else ""
            self.trace.tokens.append(TokenRecord(token, text, source, index, best))
            self.trace.output_text += text

    def _nodes(self, proposal: Proposal, verdict: Verdict, shown: list[float] | None) -> list[NodeRecord]:
        """shown[i - 1]: node i's token under its parent's target row (warped p; at temperature 0 the unwarped
        softmax), read with the round's readout."""
        tree = proposal.tree
        checks = {c.node: c for c in verdict.checks}
        accepted = set(verdict.path)
        depth = depths(tree.parents)
        nodes = [NodeRecord(0, -1, tree.tokens[0], self.decode([tree.tokens[0]]), 0, None, None, None, None, "root")]
        for i in range(1, tree.size):
            check = checks.get(i)
            status = "accepted" if i in accepted else "rejected" if check else "not_reached"
            nodes.append(NodeRecord(i, tree.parents[i], tree.tokens[i], self.decode([tree.tokens[i]]), depth[i],
                                    tree.q_token[i], shown[i - 1],
                                    check.accept_prob if check else None, check.uniform if check else None, status))
        return nodes

    def finish(self, stop_reason: str) -> Trace:
        start = time.perf_counter()
        self.trace.stop_reason = stop_reason
        if not self.record:
            self.trace.output_text = self.decode(self.trace.output_ids)
        elif self.trace.tokens:
            tail = self.detok.flush()
            self.trace.tokens[-1].text += tail
            self.trace.output_text += tail
        self.seconds += time.perf_counter() - start
        self.trace.totals = {**summarize(self.trace), "record_seconds": self.seconds, **self.extra_totals}
        return self.trace


def _decision(rule_after: dict) -> dict:
    """The controller's choice without its curves (gain, t: 33 numbers a round), for a round recorded off."""
    controller = rule_after.get("controller")
    if not controller:
        return {}
    return {"controller": {k: v for k, v in controller.items() if not isinstance(v, (list, tuple, dict))}}

