"""The Whisper beam-search trace: plain data, JSON round trip, the same conventions as decoders/trace.py.

Same family as the LLM trace (a versioned JSON object, dataclasses, TraceError with readable messages, a
consistency check on load) but its own schema: an audio input, a beam tree instead of draft rounds.

WhisperTrace (format "speclab-whisper", schema version 1)
  decoder          str   "greedy" | "beam" | "filter-ends" | "min-lookahead" | "filter-ends+min-lookahead"
  label            str   human label; says "reconstruction" for Filter-Ends / Min Lookahead
  options          dict  the WhisperOptions used (decoders/whisper/options.py)
  model, language  str
  audio            dict  {name, seconds, source_rate}
  prefix_ids       [int] the start-of-transcript tokens the decoder saw
  nodes            [BeamNode] node 0 is the root (the prefix); every other node is one candidate of one step
  steps            [BeamStep] one per decoder update
  final            [FinalCandidate] the candidates finalize() returned, best first by the length-normalised score
  output_ids, output_text   the chosen transcript (== final[0])
  seconds          wall time of the whole decode (encoder + search, lookahead rollouts included)
  rollout_forwards decoder forwards spent on lookahead rollouts (0 without lookahead)
  stop_reason      "finished" (enough finished candidates) | "sample_len" (step cap reached)

BeamNode: id, parent (node id; -1 for the root), step (-1 for the root), token, text (the token's text),
  logprob (log p(token | parent), after Whisper's logit filters), score (cumulative log-prob: the search score),
  key (the lookahead ranking key; None when no lookahead), eot_gap (EOT candidates only: log p(EOT) minus the
  best other token's log p, the quantity Filter-Ends judges), status:
    root | kept (a live beam for the next step) | finished (ended with EOT, entered the finished pool)
    | dropped (ranked out) | filtered (an EOT that the Filter-Ends rule refused) | overflow (ended with EOT
    after the finished pool was full: dropped, as Whisper does)
BeamStep: index, candidates (node ids, in score order), kept (node ids, in beam-row order), finished (node ids),
  filtered (node ids)
FinalCandidate: node (the EOT node, or the live node that finalize padded with an EOT), ids (text tokens),
  text, sum_logprob, length, normalised (sum_logprob / length penalty, Whisper's MaximumLikelihoodRanker),
  padded (True when finalize appended the EOT because too few candidates finished)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..trace import JsonTrace, TraceError, _list, _pick

FORMAT = "speclab-whisper"
SCHEMA_VERSION = 1
NODE_STATUS = ("root", "kept", "finished", "dropped", "filtered", "overflow")


@dataclass
class BeamNode:
    id: int
    parent: int
    step: int
    token: int
    text: str
    logprob: float
    score: float
    status: str
    key: float | None = None
    eot_gap: float | None = None


@dataclass
class BeamStep:
    index: int
    candidates: list[int]
    kept: list[int]
    finished: list[int] = field(default_factory=list)
    filtered: list[int] = field(default_factory=list)


@dataclass
class FinalCandidate:
    node: int
    ids: list[int]
    text: str
    sum_logprob: float
    length: int
    normalised: float
    padded: bool = False


@dataclass
class WhisperTrace(JsonTrace):
    decoder: str
    label: str
    options: dict
    model: str
    language: str
    audio: dict
    prefix_ids: list[int]
    nodes: list[BeamNode] = field(default_factory=list)
    steps: list[BeamStep] = field(default_factory=list)
    final: list[FinalCandidate] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    seconds: float = 0.0
    rollout_forwards: int = 0
    stop_reason: str = ""
    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION

    def path_ids(self, node_id: int) -> list[int]:
        """Tokens from the root (exclusive) to node_id (inclusive)."""
        ids = []
        while node_id > 0:
            ids.append(self.nodes[node_id].token)
            node_id = self.nodes[node_id].parent
        return ids[::-1]

    @classmethod
    def from_dict(cls, data: dict) -> "WhisperTrace":
        if not isinstance(data, dict):
            raise TraceError("a trace must be a JSON object")
        if data.get("format") != FORMAT:
            raise TraceError(f"not a Whisper trace (format {data.get('format')!r}, expected {FORMAT!r})")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise TraceError(f"Whisper trace schema version {data.get('schema_version')!r} is not supported "
                             f"(this SpecLab reads {SCHEMA_VERSION})")
        body = _pick(cls, data, "trace")
        body["nodes"] = [BeamNode(**_pick(BeamNode, n, "node")) for n in _list(data, "nodes")]
        body["steps"] = [BeamStep(**_pick(BeamStep, s, "step")) for s in _list(data, "steps")]
        body["final"] = [FinalCandidate(**_pick(FinalCandidate, f, "final candidate")) for f in _list(data, "final")]
        trace = cls(**body)
        check_invariants(trace)
        return trace


def check_invariants(trace: WhisperTrace, eot: int | None = None) -> None:
    """What a renderer relies on: a tree (parents precede children), kept parents exist, finished ends in EOT,
    the chosen transcript is the top of the final ranking."""
    for i, node in enumerate(trace.nodes):
        if node.id != i:
            raise TraceError(f"node {i} has id {node.id}")
        if node.status not in NODE_STATUS:
            raise TraceError(f"node {i}: unknown status {node.status!r}; expected one of {NODE_STATUS}")
        if i > 0 and not 0 <= node.parent < i:
            raise TraceError(f"node {i} has parent {node.parent} (must be an earlier node)")
    kept_before = {0}
    for step in trace.steps:
        for node_id in step.candidates:
            if trace.nodes[node_id].parent not in kept_before:
                raise TraceError(f"step {step.index}: node {node_id}'s parent was not a live beam")
        kept_before = set(step.kept)
    finished_tokens = {trace.nodes[n].token for n in range(1, len(trace.nodes)) if trace.nodes[n].status == "finished"}
    if eot is not None and finished_tokens - {eot}:
        raise TraceError(f"finished candidates must end with EOT ({eot}), found {sorted(finished_tokens - {eot})}")
    if trace.final:
        scores = [f.normalised for f in trace.final]
        if scores != sorted(scores, reverse=True):
            raise TraceError("final candidates are not ordered best first")
        if trace.final[0].ids != trace.output_ids:
            raise TraceError("the chosen transcript is not the top of the final ranking")
