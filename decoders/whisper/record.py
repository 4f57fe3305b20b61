"""Record several Whisper decoders on one clip into one file the app replays without a model (the Learn tab's
Whisper lesson): `python -m decoders.whisper.record --clip assets/audio/librivox-0880.wav --out <file>.json`.

The file ("speclab-whisper-set", version 1): the clip's name and reference transcript, and one WhisperTrace per
decoder in the order given (the first is the one the others are compared with, as on the Whisper tab).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..trace import TraceError
from .trace import WhisperTrace

FORMAT = "speclab-whisper-set"
VERSION = 1


@dataclass
class WhisperSet:
    clip: str
    reference: str
    traces: list[WhisperTrace]

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "clip": self.clip, "reference": self.reference,
                           "traces": [t.to_dict() for t in self.traces]}, indent=1, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "WhisperSet":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(f"not a JSON file: {err.msg} at line {err.lineno}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TraceError(f"not a recorded Whisper set: expected format {FORMAT!r}")
        if data.get("version") != VERSION:
            raise TraceError(f"Whisper set version {data.get('version')!r} is not {VERSION}")
        traces = [WhisperTrace.from_dict(t) for t in data.get("traces") or []]
        if not traces:
            raise TraceError("a recorded Whisper set needs at least one trace")
        return cls(str(data.get("clip", "")), str(data.get("reference", "")), traces)


def record(clip_path: Path, reference: str, decoders: list[str], **options) -> WhisperSet:
    """Every decoder on the clip with the same options (WhisperOptions fields) except the decoder."""
    from .audio import load_file
    from .options import WhisperOptions
    from .task import transcribe

    clip = load_file(clip_path)
    traces = [transcribe(clip, WhisperOptions(decoder=d, **options)) for d in decoders]
    return WhisperSet(clip_path.name, reference, traces)


def main(argv: list[str] | None = None) -> int:
    from ..options import OptionsError
    from .audio import AudioError
    from .models import ModelError

    parser = argparse.ArgumentParser(prog="python -m decoders.whisper.record", description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, required=True, help="an audio file (wav, flac, ogg, mp3)")
    parser.add_argument("--reference", default=None, help="its transcript (default: from assets/audio/clips.json)")
    parser.add_argument("--decoders", default="greedy,beam,filter-ends,min-lookahead")
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    reference = args.reference
    if reference is None:
        clips = json.loads((args.clip.parent / "clips.json").read_text()) if (args.clip.parent / "clips.json").is_file() else {}
        reference = clips.get(args.clip.name, {}).get("reference", "")
    try:
        recorded = record(args.clip, reference, args.decoders.split(","), model=args.model, beam_size=args.beam_size)
    except (AudioError, OptionsError, ModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(recorded.to_json() + "\n", encoding="utf-8")
    for trace in recorded.traces:
        print(f"{trace.label}: {trace.output_text!r} ({len(trace.steps)} steps, {trace.seconds:.2f} s)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
