"""Every Whisper decoder SpecLab knows, by name: its label, which WhisperOptions fields it reads (their defaults are
WhisperOptions' own), whether it searches with beams, and how to build it on a DecodingTask.

options.py validates against this table, task.py builds from it, and the Whisper tab's picker and bench.whisper
read it: nothing else keeps a list of decoder names or tests a name for a substring. Light on purpose (whisper is
imported only when a decoder is built), so the app can list the decoders without loading openai-whisper. Adding a
decoder is one TokenDecoder (or one policy for TracedBeam) in search.py and one DecoderSpec line below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import OptionsError
from .policy import Aggregate

# A decoders.whisper.options.WhisperOptions. Not imported, not even for types: options.py validates against this
# table, so the dependency runs one way (options -> registry; tests/test_import_graph.py keeps it so).
Options = Any


@dataclass(frozen=True)
class DecoderSpec:
    name: str
    label: str
    beams: bool                  # a beam search (reads beam_size, patience, length_penalty) or one greedy path
    filters_ends: bool = False   # Filter-Ends: an ending may finish only if EOT is within eot_margin of the best
    looks_ahead: bool = False    # Min Lookahead: live beams ranked by score + aggregate(greedy rollout)
    reconstruction: bool = False  # SpecLab's reading of the paper, not its verified method
    help: str = ""

    @property
    def fields(self) -> tuple[str, ...]:
        """The WhisperOptions fields this decoder reads beyond model, language and sample_len."""
        return (("beam_size", "patience", "length_penalty") if self.beams else ()) + \
               (("eot_margin",) if self.filters_ends else ()) + \
               (("lookahead_depth", "lookahead_aggregate") if self.looks_ahead else ())

    def build(self, task, options: Options):
        """This decoder as a whisper TokenDecoder on `task` (a task.TracedTask)."""
        from .search import EndFilter, Lookahead, TracedBeam, TracedGreedy

        if not self.beams:
            return TracedGreedy(task)
        end_filter = EndFilter(options.eot_margin) if self.filters_ends else None
        lookahead = Lookahead(options.lookahead_depth, Aggregate(options.lookahead_aggregate)) \
            if self.looks_ahead else None
        return TracedBeam(task, options.beam_size, options.patience, end_filter, lookahead)


DECODERS: dict[str, DecoderSpec] = {spec.name: spec for spec in [
    DecoderSpec("greedy", "greedy", beams=False, help="the most likely token at every step; one path, no search"),
    DecoderSpec("beam", "standard beam search (Whisper's own)", beams=True,
                help="Whisper's BeamSearchDecoder, reproduced token for token"),
    DecoderSpec("filter-ends", "Filter-Ends (SpecLab's reconstruction)", beams=True, filters_ends=True,
                reconstruction=True, help="an ending finishes only if the model itself would rather end"),
    DecoderSpec("min-lookahead", "Min Lookahead (SpecLab's reconstruction)", beams=True, looks_ahead=True,
                reconstruction=True, help="live beams ranked by a few greedy steps ahead"),
    DecoderSpec("filter-ends+min-lookahead", "Filter-Ends + Min Lookahead (SpecLab's reconstructions)", beams=True,
                filters_ends=True, looks_ahead=True, reconstruction=True, help="both"),
]}


def decoder(name: str) -> DecoderSpec:
    try:
        return DECODERS[name]
    except (KeyError, TypeError):
        raise OptionsError(f"decoder must be one of {', '.join(DECODERS)}; got {name!r}") from None


def names(reconstruction: bool | None = None) -> tuple[str, ...]:
    return tuple(n for n, spec in DECODERS.items() if reconstruction is None or spec.reconstruction == reconstruction)
