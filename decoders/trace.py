"""The one trace format every method emits and the UI renders (plain data, JSON round trip).

Schema (version 1), documented here and nowhere else.

Trace
  schema_version  int        bumped on any incompatible change
  method          str        "baseline" | "speculative"
  label           str        human label, e.g. "speculative · draft model · AdaEDL"
  options         dict       the DecodeOptions the run used (see decoders/options.py)
  models          dict       {"target": {name, dtype, device, source, kernels}, "draft": {...} | None}
  precision       str        what the dtype means for losslessness
  prompt, prompt_ids         the text and the token ids the target saw (chat template applied if chat=True)
  output_ids, output_text    generated tokens only; output_text == "".join(t.text for t in tokens)
  tokens          [TokenRecord]  per output token: id, text, provenance, round, top (the raw target logits' TOP_LOGITS
                             best [id, logit] pairs in the row that decided this token, best first; kept with
                             recording off; older traces hold two, as "top2", or none): what decoders/compare.py
                             reads, beside a float64 re-score of the position, to tell rounding from a bug
  rounds          [RoundRecord]  one per target verification forward
  stop_reason     str        "eos" | "max_new_tokens" | "cancelled" | "context" | "" (still running)
  prefill_seconds, decode_seconds   wall time (decode = after prefill; decoders/clock.py says what it counts)
  prefill         dict | None  while a prompt longer than one prefill chunk is being read (no round yet): {"model":
                             "target" | "draft", "read": prompt tokens read so far, "of": tokens to read}; None
                             once read (a run stopped while reading keeps it; absent in older traces)
  totals          dict       decoders/stats.py: summarize()
  baseline_check  dict | None  decoders/compare.py: this run against the baseline's on the same prompt, when asked
                             for (API compare_baseline=True, CLI --compare-baseline, the Race): same, kind ("same" |
                             "rounding" | "mismatch" | "sampled" | "prefix" | "unclassified"), position, the two
                             tokens, the float64 margin between them, each side's logit error, the measured noise
                             and the tolerance, and the reason (Comparison in decoders/compare.py)
  runtime         dict | None  how the run executed (absent in older traces): machine (CPU or GPU, PyTorch), device,
                             and per model ("target", "draft" when the drafter has a runner of its own): kv_cache
                             ("dynamic" | "static" | "fixed", decoders/runtime/buffers.py), capacity (buffer slots per
                             layer, None for dynamic), and for "fixed" the forwards that replayed a CUDA graph
                             ("graph") or ran eagerly ("eager") and the padded widths used (decoders/runtime/graphs.py).
                             An EAGLE head's "draft" counts its tree levels' steps, each at a fixed shape over its own
                             buffer (decoders/drafters/head_step.py; widths = frontier sizes). Early exit's verification
                             (layers k..L-1) counts as a target forward there. Every other forward (early exit's and a
                             prophet's draft steps, a draft model's tree frontiers) runs eagerly.

Provenance of an output token: "accepted" (a draft token the target accepted), "resampled" (drawn from the
residual norm(max(p - q, 0)) after a rejection), "bonus" (drawn from p after every draft on the path was
accepted), "baseline" (a plain target step: the baseline method, or a round where no draft was offered).

RoundRecord
  index; n_drafted; n_accepted; committed (ids, cut at EOS); provenance (per committed token)
  bonus_token, bonus_text, bonus_source ("bonus" | "resampled" | "baseline")
  nodes [NodeRecord]: node 0 is the root (the pending token, already committed); per node id, parent, token,
        text, depth, q (draft prob of the token under the distribution it was drawn from; None if deterministic),
        p (target prob of the token after its parent), accept_prob, uniform (the U(0,1) draw; None under greedy),
        status "root" | "accepted" | "rejected" | "not_reached". At temperature 0, p and q are the unwarped
        softmax (temperature 1) for display; acceptance is argmax matching (accept_prob 1 or 0).
  rule  the draft-length rule's internals (None for the baseline): name; limit (max drafts this round);
        reason drafting stopped ("limit" | "rule" | "budget" | "no-match" | "eos" | "mid-character"); checks, one per judged position:
        {position, entropy (AdaEDL, nats) or confidence (max-confidence), bound, lam (λ used), stop}; then the
        state after this round's update: lam and ar (AdaEDL, max-confidence), length_after (heuristic)
  target_forwards, draft_forwards; seconds {"draft", "verify", "bookkeeping"}
  search  tree drafters only (EAGLE-2, DDD; absent or None otherwise, so older traces load unchanged):
        {method, flavor (the RRS flavor the tree was verified under), steps (expansion steps run), stop
        ("depth" | "ddd" | "cost" (the draft controller) | "budget"), pool: [{id, parent (pool id, -1 = root), token, text, value (product of
        draft probabilities on the path), depth, step}], frontier: [[pool ids] per step], chosen: [pool ids sent to the
        target, in tree node order: chosen[i] is tree node i+1], ddd: [{step, H, x, stop}] (DDD's checks only)}
        suffix decoding (decoders/drafters/suffix.py) fills the same fields (pool value = the count-estimated
        probability, the product of count / of down the path; step = depth; frontier and ddd empty; stop "cap" |
        "min-prob" | "no-match" | "budget" | "cost"; the sent nodes, then the candidates the cap or, with controller
        "cost", the price left out) and
        adds: source ("this run" | "earlier outputs"), match (the tail's token ids), match_texts, match_len, cap
        (min(suffix_tokens, floor(factor · match_len))), score (sum of the drafted nodes' values), factor,
        min_prob, store {outputs, tokens}; each pool entry also has count and of (the continuation followed its
        parent string `count` of the `of` times that string occurred) and chance (controller "cost": the calibrated
        chance it is accepted, the product down its path of count / of × the trust of the match length that step
        continues; None where the cost controller did not price it: past the cap, or controller "off"); trust (the
        first step's trust, for this round's match length: steps the target took ÷ their estimated chance,
        drafters/suffix.py StepCalibration)
  totals["cost_curve"]  controller "cost" only: the t(n) curve the run weighed (decoders/costs.py describe_use:
        measured_at, age_seconds, load_per_core, context_tokens, remeasured, machine, busy, why, t);
        totals["controller"]: rounds, cap_zero, probes, mean_cap (decoders/stats.py)
  retokenized  a draft with a tokenizer of its own only (drafter "cross-tokenizer"; absent or None otherwise): the
        round's two tokenizations. {mode ("retokenized": temperature 0, the draft's text encoded by the target's
        tokenizer | "shared": sampling, each draft one target token of the same bytes), draft, target (the two
        tokenizers' model names), pieces: [{id, text, start, end}] the draft's tokens this round in its own
        vocabulary (byte offsets into the drafted text; a piece that ends inside a character shows its bytes
        escaped; a first piece that starts below 0 spells the committed text's last bytes again: token healing,
        context.healed), nodes: [{node (tree node id), start, end, pieces (indices of the draft pieces that share a byte with
        this target token)}], unsent (drafted text not sent: past the round's limit, or a character left unfinished),
        context: {kept (draft tokens of the committed text the draft's cache kept), fed (tokens fed to catch up:
        what the target committed, and the last few drafts encoded again from text), healed (optional: the
        committed text's last bytes that the first draft spelled again, "" when the round did not heal)}}
With recording off, rounds keep their counters, committed ids and timings; nodes, texts and rule checks are empty,
and rule keeps only name, limit, reason and the controller's scalar choice (cap: its plan; bound: how far the round
could go past it; best, probe, alpha, c, overruled, extended, ...; no curves): why a round drafted nothing (a cap of
0, or no n-gram match) is readable in every run.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields

SCHEMA_VERSION = 1
TOP_LOGITS = 8  # best [id, logit] pairs kept per output token (TokenRecord.top)
PROVENANCE = ("accepted", "resampled", "bonus", "baseline")
NODE_STATUS = ("root", "accepted", "rejected", "not_reached")


class TraceError(ValueError):
    """A trace file that does not match the schema."""


class JsonTrace:
    """What every trace family (chain, beam, Whisper) shares: plain-dict and JSON round trips. A family sets
    `error` to its own ValueError subclass and writes `from_dict` (its schema checks); bad JSON is one line."""

    error: type[ValueError] = TraceError  # class attribute, not a dataclass field (subclasses assign it bare)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise cls.error(f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
        return cls.from_dict(data)


@dataclass
class NodeRecord:
    id: int
    parent: int
    token: int
    text: str
    depth: int
    q: float | None
    p: float | None
    accept_prob: float | None
    uniform: float | None
    status: str


@dataclass
class TokenRecord:
    id: int
    text: str
    provenance: str
    round: int
    top: list | None = None  # [[id, logit], ...] best first: the TOP_LOGITS best tokens of the target row that decided it


@dataclass
class RoundRecord:
    index: int
    n_drafted: int
    n_accepted: int
    committed: list[int]
    provenance: list[str]
    bonus_token: int
    bonus_text: str
    bonus_source: str
    nodes: list[NodeRecord] = field(default_factory=list)
    rule: dict | None = None
    target_forwards: int = 1
    draft_forwards: int = 0
    seconds: dict = field(default_factory=lambda: {"draft": 0.0, "verify": 0.0, "bookkeeping": 0.0})
    search: dict | None = None  # tree drafters only (optional, absent in older traces), see the schema above
    retokenized: dict | None = None  # the cross-tokenizer drafter only (optional), see the schema above


@dataclass
class Trace(JsonTrace):
    method: str
    label: str
    options: dict
    models: dict
    precision: str
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    tokens: list[TokenRecord] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    stop_reason: str = ""
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    totals: dict = field(default_factory=dict)
    baseline_check: dict | None = None
    runtime: dict | None = None  # how the run executed (optional, absent in older traces), see the schema above
    prefill: dict | None = None  # how far the prompt has been read, while it is (see the schema above)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_dict(cls, data: dict) -> "Trace":
        """Validate and rebuild; raises TraceError with a readable message on any mismatch."""
        if not isinstance(data, dict):
            raise TraceError("a trace must be a JSON object")
        version = data.get("schema_version")
        if version is None:
            raise TraceError("this is not a SpecLab trace (it has no schema_version); load a JSON file saved by "
                             "SpecLab's Download button or decoders.Trace.to_json")
        if version != SCHEMA_VERSION:
            raise TraceError(f"trace schema version {version!r} is not supported (this SpecLab reads {SCHEMA_VERSION})")
        body = _pick(cls, data, "trace")
        body["tokens"] = [_token_from_dict(t) for t in _list(data, "tokens")]
        body["rounds"] = [_round_from_dict(r) for r in _list(data, "rounds")]
        trace = cls(**body)
        _check_consistency(trace)
        return trace


def _token_from_dict(data: dict) -> TokenRecord:
    body = _pick(TokenRecord, data, "token")
    if body.get("top") is None and data.get("top2") is not None:  # traces saved before TOP_LOGITS kept two, as top2
        body["top"] = data["top2"]
    return TokenRecord(**body)


def _round_from_dict(data: dict) -> RoundRecord:
    body = _pick(RoundRecord, data, "round")
    body["nodes"] = [NodeRecord(**_pick(NodeRecord, n, "node")) for n in _list(data, "nodes")]
    return RoundRecord(**body)


def _pick(cls, data: dict, what: str) -> dict:
    """The dataclass's fields from `data`; missing required fields raise TraceError."""
    if not isinstance(data, dict):
        raise TraceError(f"each {what} must be a JSON object")
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - data.keys())
    if missing:
        raise TraceError(f"{what} is missing field(s): {', '.join(missing)}")
    return {k: v for k, v in data.items() if k in names}


def _list(data: dict, key: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise TraceError(f"'{key}' must be a list")
    return value


def _check_consistency(trace: Trace) -> None:
    """The invariants a renderer relies on."""
    if [t.id for t in trace.tokens] and [t.id for t in trace.tokens] != trace.output_ids:
        raise TraceError("tokens[].id does not match output_ids")
    for token in trace.tokens:
        if token.provenance not in PROVENANCE:
            raise TraceError(f"unknown provenance {token.provenance!r}; expected one of {PROVENANCE}")
    for rnd in trace.rounds:
        if rnd.n_accepted > rnd.n_drafted:
            raise TraceError(f"round {rnd.index}: accepted ({rnd.n_accepted}) > drafted ({rnd.n_drafted})")
        for node in rnd.nodes:
            if node.status not in NODE_STATUS:
                raise TraceError(f"round {rnd.index}: unknown node status {node.status!r}")
            if node.id > 0 and not 0 <= node.parent < node.id:
                raise TraceError(f"round {rnd.index}: node {node.id} has parent {node.parent} (must precede it)")

