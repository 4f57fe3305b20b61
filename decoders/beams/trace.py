"""The beam trace: schema version 2 of SpecLab's trace, the family member for runs that keep several beams.

Version 1 (decoders/trace.py) stays the format of chain methods and still loads (`load_any`). Plain data, JSON
round trip. Documented here and nowhere else.

BeamTrace
  schema_version  2;  family  "beams"
  method          "beam-search" | "beam-sampling" | "dsbd";  label; options (DecodeOptions.to_dict()); models
  prompt, prompt_ids;  output_ids, output_text (the best candidate's generated tokens)
  candidates      [{tokens, text, score, logp}] the finished pool, distinct token sequences, best score first.
                  score: the method's ranking score divided by the generated length. Beam search: the cumulative
                  log-probability / length^length_penalty (transformers'). Beam sampling and DSBD: the log of the
                  last draw's probability in the per-step renormalised joint over (beam, token), as in the DSBD
                  code; it is NOT the sequence's log p (each step divides by that step's total, so candidates
                  that finish at different steps carry different offsets). logp: the target's own cumulative
                  log-probability of the tokens (temperature 1, no top-k/top-p), recorded from the same forwards.
  iterations      [Iteration], one per target forward
  stop_reason     "eos" | "max_new_tokens" | "cancelled" | "";  prefill_seconds, decode_seconds (one clock for
                  every method, decoders/clock.py: decode time starts after prefill and leaves out the consumer)
  totals          {tokens, iterations, target_forwards, draft_forwards, peak_kv_bytes, tokens_per_second}

Iteration
  index
  nodes   [{id, row, layer, token, text, parent, q, p, status, u, accept_prob}] the forest: layer 0 holds one root
          per input beam (row = its index, status "root"); layer ℓ ≥ 1 nodes are the step's beams (beam search and
          beam sampling: status "accepted") or DSBD's draft draws (status "accepted" | "rejected" | "not_reached";
          q = the draft's joint probability of (parent, token), p = the target's, None where never judged).
          parent < id always; a node's parent is a node of the previous layer.
  layers  [{layer, width, distribution, thres, passed, accepted}] DSBD only: the chosen width K_ℓ, the
          acceptance-count distribution D[W] (sums to 1), the thres cut, whether the layer produced K_ℓ beams
  stopped_at   the layer where verification stopped (DSBD), None when every drafted layer passed
  beams   [{row, tokens, score, logp}] the beams carried forward: their input row, the tokens this iteration
          added, their score (beam sampling, DSBD: log of the per-step renormalised probability of their last draw;
          beam search: cumulative log-probability) and logp (the target's cumulative log p, as for candidates)
  ended   [{row, tokens, score, logp}] DSBD: beams that drew EOS on a layer that passed (they left the live set)
  finished     [[tokens, score]] the pool after this iteration
  kv_bytes     {"target": bytes, "draft": bytes} held after the iteration;  target_rows  live target KV rows
  target_forwards, draft_forwards
"""
from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields

from ..trace import JsonTrace, Trace

SCHEMA_VERSION = 2
FAMILY = "beams"
NODE_STATUS = ("root", "accepted", "rejected", "not_reached")


class BeamTraceError(ValueError):
    """A beam trace that does not match the schema; the message says what is wrong."""


@dataclass
class BeamTrace(JsonTrace):
    method: str
    label: str
    options: dict
    models: dict
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    candidates: list[dict] = field(default_factory=list)
    iterations: list[dict] = field(default_factory=list)
    stop_reason: str = ""
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    totals: dict = field(default_factory=dict)
    family: str = FAMILY
    schema_version: int = SCHEMA_VERSION

    error = BeamTraceError

    @classmethod
    def from_dict(cls, data: dict) -> "BeamTrace":
        if not isinstance(data, dict):
            raise BeamTraceError("a beam trace must be a JSON object")
        if data.get("schema_version") != SCHEMA_VERSION or data.get("family") != FAMILY:
            raise BeamTraceError(f"not a beam trace (schema_version {data.get('schema_version')!r}, family "
                                 f"{data.get('family')!r}); load chain traces with decoders.Trace.from_json")
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - data.keys())
        if missing:
            raise BeamTraceError(f"beam trace is missing field(s): {', '.join(missing)}")
        trace = cls(**{k: v for k, v in data.items() if k in names})
        check(trace)
        return trace


def check(trace: BeamTrace) -> None:
    """The invariants a forest renderer relies on."""
    for it in trace.iterations:
        where = f"iteration {it.get('index')}"
        layer_of = {}
        for node in it.get("nodes", []):
            if node["status"] not in NODE_STATUS:
                raise BeamTraceError(f"{where}: unknown node status {node['status']!r}")
            if node["layer"] == 0:
                if node["parent"] != -1:
                    raise BeamTraceError(f"{where}: root node {node['id']} has a parent")
            elif not 0 <= node["parent"] < node["id"] or layer_of.get(node["parent"]) != node["layer"] - 1:
                raise BeamTraceError(f"{where}: node {node['id']}'s parent {node['parent']} is not a node of the "
                                     "previous layer listed before it")
            layer_of[node["id"]] = node["layer"]
        for layer in it.get("layers", []):
            if abs(sum(layer["distribution"]) - 1.0) > 1e-4:
                raise BeamTraceError(f"{where}, layer {layer['layer']}: D[W] sums to {sum(layer['distribution'])}")
            if not 0 <= layer["width"] <= len(layer["distribution"]) - 1:
                raise BeamTraceError(f"{where}, layer {layer['layer']}: width {layer['width']} outside 0..W")


def load_any(text: str):
    """A Trace (schema 1, chain methods) or a BeamTrace (schema 2, family "beams") from its JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BeamTraceError(f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
    if isinstance(data, dict) and data.get("family") == FAMILY:
        return BeamTrace.from_dict(data)
    return Trace.from_dict(data)
