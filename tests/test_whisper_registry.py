"""decoders/whisper/registry.py: one table of Whisper decoders that options, the builder, the tab and bench read;
a name is looked up, never tested for a substring, and a typo is an error with the known names."""
from __future__ import annotations

import pytest

pytest.importorskip("whisper")

from decoders.options import OptionsError  # noqa: E402
from decoders.whisper import registry  # noqa: E402
from decoders.whisper.options import DECODERS, WhisperOptions  # noqa: E402
from decoders.whisper.search import EndFilter, Lookahead, TracedBeam, TracedGreedy  # noqa: E402


class FakeTask:
    """What TracedGreedy / TracedBeam read from a task at construction."""

    class tokenizer:
        eot = 50256

    inference = None


def test_every_part_of_speclab_lists_the_registry_s_decoders():
    from app.tabs.whisper.handlers import DECODERS as TAB_DECODERS

    assert DECODERS == TAB_DECODERS == tuple(registry.DECODERS)
    assert registry.names(reconstruction=True) == ("filter-ends", "min-lookahead", "filter-ends+min-lookahead")
    assert WhisperOptions(decoder="min-lookahead").label == "Min Lookahead (SpecLab's reconstruction)"


@pytest.mark.parametrize("name", DECODERS)
def test_each_decoder_is_built_from_its_spec(name):
    spec = registry.decoder(name)
    built = spec.build(FakeTask, WhisperOptions(decoder=name, beam_size=3, eot_margin=0.7, lookahead_depth=3,
                                                lookahead_aggregate="mean"))
    if not spec.beams:
        assert isinstance(built, TracedGreedy) and spec.fields == ()
        return
    assert isinstance(built, TracedBeam) and built.beam_size == 3
    assert (built.end_filter == EndFilter(0.7)) if spec.filters_ends else built.end_filter is None
    assert (built.lookahead == Lookahead(3, registry.Aggregate.MEAN)) if spec.looks_ahead else built.lookahead is None
    assert ("eot_margin" in spec.fields) == spec.filters_ends and ("lookahead_depth" in spec.fields) == spec.looks_ahead


def test_typos_are_errors_not_other_behaviour():
    """The old dispatch tested substrings: 'min-lookahead-typo' would have run Min Lookahead."""
    for bad in ("min-lookahead-typo", "Filter-Ends", "beam ", ""):
        with pytest.raises(OptionsError, match="decoder must be one of greedy, beam"):
            WhisperOptions(decoder=bad).validate()
    with pytest.raises(OptionsError, match="lookahead_aggregate must be one of min, mean, sum"):
        WhisperOptions(lookahead_aggregate="minimum").validate()
    with pytest.raises(ValueError):
        Lookahead(2, "median").key(0.0, __import__("numpy").array([-1.0]))
