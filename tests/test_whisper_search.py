"""Traced Whisper decoders: greedy and standard beam reproduce whisper's own; the reconstructions behave as
documented; lookahead rollouts leave the task's kv-cache intact; trace invariants hold."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("whisper")

from whisper_helpers import SHORT_CLIPS, TINY, clip, tiny_model  # noqa: E402

from decoders.options import OptionsError  # noqa: E402
from decoders.whisper.options import DECODERS, WhisperOptions  # noqa: E402
from decoders.whisper.search import Lookahead, TracedBeam  # noqa: E402
from decoders.whisper.task import mel_for, transcribe  # noqa: E402
from decoders.whisper.trace import TraceError, WhisperTrace, check_invariants  # noqa: E402

pytestmark = pytest.mark.slow
EOT = 50256  # tiny.en


def whisper_reference(name: str, beam_size: int | None, patience: float | None = None):
    import whisper

    model = tiny_model()
    return whisper.decode(model, mel_for(model, clip(name)), whisper.DecodingOptions(
        language="en", beam_size=beam_size, patience=patience, without_timestamps=True, fp16=False, sample_len=96))


@pytest.mark.parametrize("name", SHORT_CLIPS)
def test_greedy_reproduces_whisper(name):
    ours = transcribe(clip(name), WhisperOptions(model=TINY, decoder="greedy"))
    theirs = whisper_reference(name, None)
    assert ours.output_ids == theirs.tokens and ours.output_text == theirs.text


@pytest.mark.parametrize("name,beam_size,patience", [(SHORT_CLIPS[0], 5, 1.0), (SHORT_CLIPS[1], 5, 1.0),
                                                     (SHORT_CLIPS[1], 3, 2.0)])
def test_standard_beam_reproduces_whisper_token_for_token(name, beam_size, patience):
    ours = transcribe(clip(name), WhisperOptions(model=TINY, decoder="beam", beam_size=beam_size, patience=patience))
    theirs = whisper_reference(name, beam_size, patience)
    assert ours.output_ids == theirs.tokens
    assert math.isclose(ours.final[0].sum_logprob / (len(ours.output_ids) + 1), theirs.avg_logprob, abs_tol=1e-6)
    finished = [n for n in ours.nodes if n.status == "finished"]
    assert len(finished) == round(beam_size * patience) or ours.final[-1].padded


def rollout_but_rank_by_score(protect: bool):
    return lambda task: TracedBeam(task, 3, 1.0, None, Lookahead(2, "min", rank_by_key=False,
                                                                  protect_task_cache=protect))


def test_lookahead_rollouts_leave_the_task_kv_cache_intact():
    """Rollouts at every step whose keys are recorded but not used: the search must be exactly standard beam."""
    audio = clip(SHORT_CLIPS[0])
    options = WhisperOptions(model=TINY, decoder="beam", beam_size=3)
    plain = transcribe(audio, options)
    with_rollouts = transcribe(audio, options, decoder=rollout_but_rank_by_score(protect=True))
    assert with_rollouts.rollout_forwards > 0
    assert [n.key for n in with_rollouts.nodes if n.status == "kept"][0] is not None
    assert with_rollouts.output_ids == plain.output_ids
    assert [(n.token, n.score) for n in with_rollouts.nodes] == [(n.token, n.score) for n in plain.nodes]


def test_unprotected_rollouts_hit_the_task_cache():
    """The same run with the task's cache hooks left attached (the trap in the spec): the task's hooks fire on
    the rollout and try to append its keys (one row per candidate) to the beams' 3-row cache, which here fails
    loudly (with as many rollout rows as beams it would corrupt silently). Proof that the test above exercises the hooks."""
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(model=TINY, decoder="beam", beam_size=3),
                   decoder=rollout_but_rank_by_score(protect=False))


def test_filter_ends_with_a_huge_margin_is_standard_beam():
    audio = clip(SHORT_CLIPS[1])
    plain = transcribe(audio, WhisperOptions(model=TINY, decoder="beam"))
    lenient = transcribe(audio, WhisperOptions(model=TINY, decoder="filter-ends", eot_margin=50.0))
    assert lenient.output_ids == plain.output_ids
    assert not any(n.status == "filtered" for n in lenient.nodes)


def test_filter_ends_admits_only_endings_within_the_margin():
    trace = transcribe(clip(SHORT_CLIPS[1]), WhisperOptions(model=TINY, decoder="filter-ends", eot_margin=0.0))
    finished = [n for n in trace.nodes if n.status == "finished"]
    filtered = [n for n in trace.nodes if n.status == "filtered"]
    assert finished and all(n.eot_gap >= 0.0 for n in finished)
    assert all(n.token == EOT and n.eot_gap < 0.0 for n in filtered)


def test_min_lookahead_ranks_live_beams_by_key():
    trace = transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(model=TINY, decoder="min-lookahead", beam_size=3,
                                                            lookahead_depth=2))
    assert trace.rollout_forwards == 2 * len(trace.steps) - 2 * sum(1 for s in trace.steps if not s.kept)
    for step in trace.steps:
        growing = [trace.nodes[i] for i in step.candidates if trace.nodes[i].token != EOT]
        assert all(n.key is not None and n.key <= n.score + 1e-6 for n in growing)  # min of log-probs <= 0
        kept = [trace.nodes[i] for i in step.kept]
        dropped = [n for n in growing if n.status == "dropped"]
        if kept and dropped:
            assert min(n.key for n in kept) >= max(n.key for n in dropped)


@pytest.mark.parametrize("decoder", DECODERS)
def test_trace_invariants_and_json_round_trip(decoder):
    trace = transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(model=TINY, decoder=decoder, beam_size=3))
    check_invariants(trace, eot=EOT)
    ids = {n.id for n in trace.nodes}
    for step in trace.steps:
        assert all(trace.nodes[k].parent in ids and trace.nodes[k].status == "kept" for k in step.kept)
    for candidate in trace.final:
        node = trace.nodes[candidate.node]
        assert node.token == EOT or candidate.padded  # finished ones end with EOT; padded ones get it appended
        assert trace.path_ids(candidate.node)[:len(candidate.ids)] == candidate.ids
    assert trace.output_ids == trace.final[0].ids and trace.output_text == trace.final[0].text
    again = WhisperTrace.from_json(trace.to_json())
    assert again.to_dict() == trace.to_dict()


def test_invariant_check_catches_a_wrong_choice():
    trace = transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(model=TINY, decoder="beam", beam_size=3))
    data = trace.to_dict()
    data["output_ids"] = data["final"][-1]["ids"] + [11]
    with pytest.raises(TraceError, match="top of the final ranking"):
        WhisperTrace.from_dict(data)
    data = trace.to_dict()
    data["nodes"][5]["parent"] = 7
    with pytest.raises(TraceError, match="parent"):
        WhisperTrace.from_dict(data)


def test_english_only_model_refuses_another_language():
    with pytest.raises(OptionsError, match="English-only; choose whisper-base"):
        transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(model=TINY, language="vi"))


def test_options_say_how_to_fix_them():
    with pytest.raises(OptionsError, match="decoder must be one of"):
        WhisperOptions(decoder="nucleus").validate()
    with pytest.raises(OptionsError, match="lookahead_aggregate"):
        WhisperOptions(lookahead_aggregate="max").validate()
    with pytest.raises(OptionsError, match="unknown language"):
        WhisperOptions(language="klingon").validate()
