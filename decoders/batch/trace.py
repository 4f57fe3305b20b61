"""The batch trace: each row's normal Trace (every existing view works on a row) + what the batch did per round.

BatchTrace is a list of the rows' Traces (row r = prompts[r]), with:
  rounds   [BatchRound]  one per batched target forward:
           index; rows (the row ids still decoding, in batch order); drafted, accepted, committed (per row in
           `rows`: drafts offered, drafts accepted, tokens added); finished (row ids that left after the round);
           padding_added / padding_removed (pad slots written / freed in the target's and the draft model's caches
           this round); padding_held (pad slots left in the target's cache); width (the target cache's slots per row
           after the round); seconds {draft, verify, bookkeeping, realign}
  options, label, prefill_seconds, decode_seconds (the batch's one clock, decoders/clock.py)
  totals   tokens, tokens_per_second (all rows' tokens / the batch's decode time), realign_seconds, realign_share
           (of decode time), rounds, tau (per row), peak_kv_bytes (target + draft caches), batch
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..trace import Trace, TraceError


@dataclass
class BatchRound:
    index: int
    rows: list[int]
    drafted: list[int]
    accepted: list[int]
    committed: list[int]
    finished: list[int] = field(default_factory=list)
    padding_added: int = 0
    padding_removed: int = 0
    padding_held: int = 0
    width: int = 0
    seconds: dict = field(default_factory=dict)


class BatchTrace(list):
    """The rows' Traces as a list, plus the batch's own rounds and totals (see the module docstring)."""

    def __init__(self, rows: list[Trace], options: dict, label: str):
        super().__init__(rows)
        self.options = options
        self.label = label
        self.rounds: list[BatchRound] = []
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.totals: dict = {}

    def summarize(self, peak_kv_bytes: int = 0) -> dict:
        tokens = sum(len(row.output_ids) for row in self)
        realign = sum(r.seconds.get("realign", 0.0) for r in self.rounds)
        self.totals = {
            "batch": len(self), "tokens": tokens, "rounds": len(self.rounds),
            "tokens_per_second": tokens / self.decode_seconds if self.decode_seconds > 0 else None,
            "realign_seconds": realign,
            "realign_share": realign / self.decode_seconds if self.decode_seconds > 0 else None,
            "tau": [_tau(row) for row in self],
            "padding_added": sum(r.padding_added for r in self.rounds),
            "peak_kv_bytes": peak_kv_bytes, "decode_seconds": self.decode_seconds,
            "prefill_seconds": self.prefill_seconds,
        }
        return self.totals

    @property
    def output_ids(self) -> list[list[int]]:
        return [row.output_ids for row in self]

    def to_dict(self) -> dict:
        return {"kind": "batch", "label": self.label, "options": self.options, "rows": [row.to_dict() for row in self],
                "rounds": [asdict(r) for r in self.rounds], "prefill_seconds": self.prefill_seconds,
                "decode_seconds": self.decode_seconds, "totals": self.totals}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "BatchTrace":
        if not isinstance(data, dict) or data.get("kind") != "batch":
            raise TraceError("this is not a SpecLab batch trace (no kind 'batch'); save one with BatchTrace.to_json")
        try:
            trace = cls([Trace.from_dict(row) for row in data["rows"]], data["options"], data["label"])
            trace.rounds = [BatchRound(**r) for r in data["rounds"]]
        except (KeyError, TypeError) as err:
            raise TraceError(f"batch trace is missing or has a malformed field: {err}") from None
        trace.prefill_seconds = float(data.get("prefill_seconds", 0.0))
        trace.decode_seconds = float(data.get("decode_seconds", 0.0))
        trace.totals = dict(data.get("totals") or {})
        return trace

    @classmethod
    def from_json(cls, text: str) -> "BatchTrace":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as err:
            raise TraceError(f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None


def _tau(row: Trace) -> float | None:
    """The row's τ: its totals' once finished, else tokens so far over rounds so far (one target forward each)."""
    if row.totals.get("tau") is not None:
        return row.totals["tau"]
    return len(row.output_ids) / len(row.rounds) if row.rounds else None
