"""Whisper token decoders that record their search: greedy, standard beam, and two RECONSTRUCTIONS.

All are openai-whisper TokenDecoder subclasses, plugged into a DecodingTask subclass (task.py); nothing of
whisper's own files is copied or patched. One clip at a time (upstream beam search breaks on batches: its cross-attention cache keeps one row per clip and
relies on broadcasting, which fails for more than one clip with beam_size > 1).

- TracedGreedy: whisper's GreedyDecoder, plus a record of the top alternatives at each step.
- TracedBeam with no policies: whisper's BeamSearchDecoder step for step (same candidate pool of B+1 tokens per
  beam, same dict/sort order, same float32 sums), so it reproduces whisper.decode(beam_size=B, patience=P).
- EndFilter ("Filter-Ends", a RECONSTRUCTION: the paper's definition was not retrievable): an EOT candidate may
  enter the finished pool only if log p(EOT) is within `margin` nats of the best other token after the same
  beam. Whisper lets an ending in as soon as its cumulative score ranks among the top, even when the model
  itself prefers to go on; those premature endings fill the pool and stop the search early.
- Lookahead ("Min Lookahead", a RECONSTRUCTION): each live candidate is rolled forward `depth` greedy steps
  and ranked by score + aggregate(rollout log-probs), aggregate "min" (the worst upcoming step), "mean" or
  "sum". Only which live beams survive changes; endings are judged on the plain score as in Whisper.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from whisper.decoding import BeamSearchDecoder, GreedyDecoder

from .policy import Aggregate
from .rollout import greedy_rollout
from .trace import BeamNode, BeamStep

AGGREGATES = tuple(Aggregate)
FOLD = {Aggregate.MIN: np.min, Aggregate.MEAN: np.mean, Aggregate.SUM: np.sum}
GREEDY_ALTERNATIVES = 4  # how many runner-up tokens the greedy trace shows per step


@dataclass(frozen=True)
class EndFilter:
    margin: float = 1.0  # nats: accept an ending when log p(EOT) >= best other log p - margin

    def accepts(self, eot_gap: float) -> bool:
        return eot_gap >= -self.margin


@dataclass(frozen=True)
class Lookahead:
    depth: int = 2
    aggregate: Aggregate = Aggregate.MIN
    rank_by_key: bool = True  # False: compute and record keys but rank by score (the kv-cache test uses it)
    protect_task_cache: bool = True  # False reproduces the kv-cache bug; only tests set it

    def key(self, score: float, rollout: np.ndarray) -> float:
        future = rollout[~np.isnan(rollout)]
        if len(future) == 0:
            return score
        return score + float(FOLD[Aggregate(self.aggregate)](future))  # a typo raises instead of picking a default


class TreeRecorder:
    """Builds the BeamNode / BeamStep lists as a decoder runs; rows map beam rows to node ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.nodes = [BeamNode(0, -1, -1, -1, "", 0.0, 0.0, "root")]
        self.steps: list[BeamStep] = []
        self.row_nodes: list[int] | None = None  # node id of each current beam row
        self.rollout_forwards = 0

    def parent_of_row(self, row: int) -> int:
        return 0 if self.row_nodes is None else self.row_nodes[row]

    def add(self, parent_row: int, token: int, logprob: float, score: float) -> BeamNode:
        node = BeamNode(len(self.nodes), self.parent_of_row(parent_row), len(self.steps), token,
                        self.tokenizer.decode([token]), logprob, score, "dropped")
        self.nodes.append(node)
        return node

    def close_step(self, candidates: list[BeamNode], kept: list[BeamNode]) -> None:
        self.steps.append(BeamStep(len(self.steps), [c.id for c in candidates], [k.id for k in kept],
                                   [c.id for c in candidates if c.status == "finished"],
                                   [c.id for c in candidates if c.status == "filtered"]))
        self.row_nodes = [k.id for k in kept]


class TracedGreedy(GreedyDecoder):
    def __init__(self, task):
        super().__init__(0.0, task.tokenizer.eot)
        self.task = task

    def reset(self):
        self.recorder = TreeRecorder(self.task.tokenizer)

    def update(self, tokens, logits, sum_logprobs):
        if tokens.shape[0] != 1:
            raise ValueError("SpecLab's Whisper decoders take one clip at a time")
        if tokens[0, -1] == self.eot:  # already ended: whisper keeps appending EOT until all rows end
            return super().update(tokens, logits, sum_logprobs)
        logprobs = F.log_softmax(logits.float(), dim=-1)[0]                   # (V,)
        top = logprobs.topk(GREEDY_ALTERNATIVES + 1)
        before = float(sum_logprobs[0])
        new_tokens, completed = super().update(tokens, logits, sum_logprobs)
        chosen = int(new_tokens[0, -1])
        candidates, kept = [], []
        for logprob, token in zip(top.values.tolist(), top.indices.tolist()):
            node = self.recorder.add(0, token, logprob, before + logprob)
            node.status = ("finished" if token == self.eot else "kept") if token == chosen else "dropped"
            if token == self.eot:
                node.eot_gap = logprob - max(v for v, t in zip(top.values.tolist(), top.indices.tolist()) if t != self.eot)
            candidates.append(node)
            kept += [node] if node.status == "kept" else []
        self.recorder.close_step(candidates, kept)
        return new_tokens, completed

    def finalize(self, tokens, sum_logprobs):
        last = self.recorder.steps[-1] if self.recorder.steps else None
        chosen = [n for n in (last.kept + last.finished)] if last else [0]
        self.final_nodes = [(chosen[0], self.recorder.nodes[chosen[0]].status != "finished")]
        tokens, sum_logprobs = super().finalize(tokens, sum_logprobs)  # (1, 1, L+1) with an EOT appended
        self.final_candidates = [(tokens[0, 0].tolist(), sum_logprobs[0][0])]
        return tokens, sum_logprobs


class TracedBeam(BeamSearchDecoder):
    def __init__(self, task, beam_size: int, patience: float | None,
                 end_filter: EndFilter | None = None, lookahead: Lookahead | None = None):
        super().__init__(beam_size, task.tokenizer.eot, task.inference, patience)
        self.task, self.end_filter, self.lookahead = task, end_filter, lookahead

    def reset(self):
        super().reset()
        self.recorder = TreeRecorder(self.task.tokenizer)
        self.finished_nodes: dict[tuple, int] = {}

    def update(self, tokens, logits, sum_logprobs):
        B = self.beam_size
        if tokens.shape[0] != B:
            raise ValueError("SpecLab's Whisper decoders take one clip at a time")
        if self.finished_sequences is None:
            self.finished_sequences = [{}]
        logprobs = F.log_softmax(logits.float(), dim=-1)                    # (B, V)
        scores, sources, nodes = self._candidate_pool(tokens, logprobs, sum_logprobs)
        by_score = sorted(scores, key=scores.get, reverse=True)            # whisper's order (stable on ties)
        live = self._choose_live(by_score, scores, tokens.device, nodes)
        newly_finished = self._endings_above_cutoff(by_score, live, scores, nodes)
        for row, sequence in enumerate(live):                              # the task keeps this tensor: in place
            sum_logprobs[row] = scores[sequence]
            nodes[sequence].status = "kept"
        self.inference.rearrange_kv_cache([sources[s] for s in live])
        self._admit_finished(newly_finished, scores, nodes)
        self.recorder.close_step([nodes[s] for s in by_score], [nodes[s] for s in live])
        completed = len(self.finished_sequences[0]) >= self.max_candidates
        return torch.tensor(live, device=tokens.device), completed

    def _candidate_pool(self, tokens, logprobs, sum_logprobs):
        """Whisper's STEP 1: the top B+1 tokens of every beam; a dict, so step 0's identical rows collapse."""
        scores, sources, nodes = {}, {}, {}
        for row in range(self.beam_size):
            prefix = tokens[row].tolist()
            top_logprobs, top_tokens = logprobs[row].topk(self.beam_size + 1)
            best_other = self._best_non_eot(logprobs[row])
            for logprob, token in zip(top_logprobs, top_tokens):
                score = (sum_logprobs[row] + logprob).item()              # float32 sum, as whisper does
                sequence = tuple(prefix + [token.item()])
                scores[sequence], sources[sequence] = score, row
                if sequence not in nodes:  # step 0: the B rows are the same prefix; one node per sequence
                    nodes[sequence] = self.recorder.add(row, token.item(), logprob.item(), score)
                if token.item() == self.eot:
                    nodes[sequence].eot_gap = logprob.item() - best_other
        return scores, sources, nodes

    def _best_non_eot(self, row_logprobs) -> float:
        masked = row_logprobs.clone()
        masked[self.eot] = float("-inf")
        return masked.max().item()

    def _choose_live(self, by_score, scores, device, nodes) -> list[tuple]:
        """The B sequences that stay alive: the best non-EOT by score, or by lookahead key when enabled."""
        growing = [s for s in by_score if s[-1] != self.eot]
        if self.lookahead is None:
            return growing[:self.beam_size]
        keys = self._lookahead_keys(growing, scores, device)
        for sequence, key in keys.items():
            nodes[sequence].key = key
        if not self.lookahead.rank_by_key:
            return growing[:self.beam_size]
        return sorted(growing, key=keys.get, reverse=True)[:self.beam_size]  # stable: ties keep score order

    def _lookahead_keys(self, growing, scores, device) -> dict[tuple, float]:
        if not growing:
            return {}
        rows = torch.tensor(growing, device=device)                         # (n, L+1)
        rollout = greedy_rollout(self.task, self.task.audio_features, rows, self.lookahead.depth,
                                 self.lookahead.protect_task_cache).cpu().numpy()  # (n, depth)
        self.recorder.rollout_forwards += self.lookahead.depth
        return {s: self.lookahead.key(scores[s], r) for s, r in zip(growing, rollout)}

    def _endings_above_cutoff(self, by_score, live, scores, nodes) -> list[tuple]:
        """Whisper's rule: EOT candidates that rank (by score) above the B-th growing candidate by score."""
        cutoff = [s for s in by_score if s[-1] != self.eot][:self.beam_size]
        last = by_score.index(cutoff[-1]) if len(cutoff) == self.beam_size else len(by_score)
        endings = [s for s in by_score[:last] if s[-1] == self.eot]
        if self.end_filter is None:
            return endings
        accepted = []
        for sequence in endings:
            if self.end_filter.accepts(nodes[sequence].eot_gap):
                accepted.append(sequence)
            else:
                nodes[sequence].status = "filtered"
        return accepted

    def _admit_finished(self, newly_finished, scores, nodes) -> None:
        pool = self.finished_sequences[0]
        for sequence in sorted(newly_finished, key=scores.get, reverse=True):
            if len(pool) >= self.max_candidates:
                nodes[sequence].status = "overflow"
                continue
            pool[sequence] = scores[sequence]
            nodes[sequence].status = "finished"
            self.finished_nodes[sequence] = nodes[sequence].id

    def finalize(self, preceding_tokens, sum_logprobs):
        rows = {tuple(preceding_tokens[0, j].tolist() + [self.eot]): self.recorder.parent_of_row(j)
                for j in range(preceding_tokens.shape[1])}
        tokens, logprobs = super().finalize(preceding_tokens, sum_logprobs)
        self.final_nodes = [(self.finished_nodes[tuple(t.tolist())], False) if tuple(t.tolist()) in self.finished_nodes
                            else (rows[tuple(t.tolist())], True) for t in tokens[0]]
        self.final_candidates = [(t.tolist(), lp) for t, lp in zip(tokens[0], logprobs[0])]
        return tokens, logprobs
