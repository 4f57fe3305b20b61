"""Whisper run options: one frozen dataclass, validated up front with messages that say how to fix the problem."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..options import OptionsError
from .registry import Aggregate, DecoderSpec, decoder, names

DECODERS = names()  # the registry's (decoders/whisper/registry.py), in its order
RECONSTRUCTIONS = names(reconstruction=True)
MAX_BEAM = 16
MAX_SAMPLE_LEN = 224  # whisper's own default: n_text_ctx // 2


@dataclass(frozen=True)
class WhisperOptions:
    model: str = "whisper-tiny.en"
    decoder: str = "beam"             # a name in registry.DECODERS
    language: str = "en"              # a Whisper language code; English-only models need "en"
    beam_size: int = 5                # Whisper's CLI default
    patience: float = 1.0             # stop once round(beam_size * patience) candidates finished
    length_penalty: float | None = None  # None: rank finished candidates by sum log-prob / length (Whisper's default)
    eot_margin: float = 1.0           # Filter-Ends: nats by which EOT may trail the best other token
    lookahead_depth: int = 2          # Min Lookahead: greedy steps rolled out per candidate
    lookahead_aggregate: str = Aggregate.MIN  # Min Lookahead: how the rollout's log-probs fold into one number
    sample_len: int = 96              # most text tokens per clip (a 30 s window rarely needs more)

    def validate(self) -> "WhisperOptions":
        decoder(self.decoder)  # an unknown name raises, listing the known ones
        if not 1 <= self.beam_size <= MAX_BEAM:
            raise OptionsError(f"beam_size must be between 1 and {MAX_BEAM}, got {self.beam_size}")
        if not 0.5 <= self.patience <= 10 or round(self.beam_size * self.patience) < 1:
            raise OptionsError(f"patience must be in [0.5, 10] with beam_size * patience >= 1, got {self.patience}")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise OptionsError(f"length_penalty must be None (length-normalised) or in [0, 1], got {self.length_penalty}")
        if not 0 <= self.eot_margin <= 50:
            raise OptionsError(f"eot_margin must be between 0 and 50 nats, got {self.eot_margin}")
        if not 1 <= self.lookahead_depth <= 8:
            raise OptionsError(f"lookahead_depth must be between 1 and 8 steps, got {self.lookahead_depth}")
        if self.lookahead_aggregate not in tuple(Aggregate):
            raise OptionsError(f"lookahead_aggregate must be one of {', '.join(Aggregate)}; "
                               f"got {self.lookahead_aggregate!r}")
        if not 1 <= self.sample_len <= MAX_SAMPLE_LEN:
            raise OptionsError(f"sample_len must be between 1 and {MAX_SAMPLE_LEN}, got {self.sample_len}")
        _check_language(self.language)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def spec(self) -> DecoderSpec:
        return decoder(self.decoder)

    @property
    def label(self) -> str:
        return self.spec.label


def _check_language(code: str) -> None:
    from whisper.tokenizer import LANGUAGES

    if code not in LANGUAGES:
        raise OptionsError(f"unknown language {code!r}; use a Whisper code such as en, vi, fr, de")
