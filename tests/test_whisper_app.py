"""The Whisper tab's handlers and views, without a browser: bad audio gives a message, decoders side by side,
word-level diff and WER, the beam tree per step."""
from __future__ import annotations

import pytest

pytest.importorskip("whisper")

from whisper_helpers import AUDIO, CLIPS, SHORT_CLIPS  # noqa: E402

from app.figures.whisper import BEAM_LABELS, beam_figure, diff_html, shown_nodes  # noqa: E402
from app.tabs.whisper.handlers import DECODERS, show_step, transcribe_all  # noqa: E402
from decoders.whisper.trace import WhisperTrace  # noqa: E402
from decoders.whisper.wer import align, corpus_wer, normalise, wer  # noqa: E402

KNOBS = dict(beam_size=3, eot_margin=1.0, depth=2, aggregate="min")


def run(audio, decoders=("greedy", "beam"), model="whisper-tiny.en", language="en", reference=""):
    return transcribe_all(audio, reference, model, language, list(decoders), **KNOBS)


def test_wer_uses_whisper_s_normalisers_and_jiwer():
    assert normalise("He was not an ill-disposed young man.") == "he was not an ill disposed young man".split()
    assert normalise("Ten of clubs, Mr. Smith's colour") == "10 of clubs mister smith is color".split()
    assert normalise("Il fait très beau ce week-end, l'on dit.", "fr") == "il fait très beau ce week end l on dit".split()
    assert normalise("Xin chào, tôi tên là Nam.", "vi") == "xin chào tôi tên là nam".split()  # tones kept
    assert wer("ten of clubs", "10 of clubs") == 0.0  # the same words to Whisper's English normaliser
    assert wer("a b c", "a x c") == pytest.approx(1 / 3)
    assert wer("a b c", "a b c d") == pytest.approx(1 / 3)
    assert wer("a b", "") == 1.0
    assert [op.op for op in align("a b c", "a c")] == ["ok", "del", "ok"]
    assert [op.op for op in align("a b", "x a b y")] == ["ins", "ok", "ok", "ins"]
    assert corpus_wer([("a b", "a b"), ("c d e f", "c")]) == pytest.approx(3 / 6)
    with pytest.raises(ValueError, match="reference"):
        wer("", "anything")


def test_diff_marks_substitutions_insertions_and_deletions():
    out = diff_html("he was an ill man", "he was an old man indeed")
    assert 'class="wd-sub" ' in out and "reference: ill" in out and 'class="wd-ins"' in out
    assert 'class="wd-del"' in diff_html("he was an ill man", "he was ill man")


def test_text_file_renamed_wav_gives_a_message(tmp_path):
    fake = tmp_path / "speech.wav"
    fake.write_text("hello, I am a text file")
    out = run(str(fake))
    assert "not an audio file" in out["error"] and "speech.wav" in out["error"]


def test_silent_and_missing_audio_give_messages():
    import numpy as np

    assert "silent" in run((16_000, np.zeros(16_000, dtype=np.int16)))["error"]
    noise = (np.random.default_rng(0).standard_normal(16_000 * 31) * 3000).astype(np.int16)  # 31 s
    too_long = run((16_000, noise))
    assert "trim the clip" in too_long["error"] and "Traceback" not in too_long["error"]
    assert "Record or upload" in run(None)["error"]
    assert "at least one decoder" in run(str(AUDIO / SHORT_CLIPS[0]), decoders=())["error"]


@pytest.mark.slow
def test_english_only_model_with_vietnamese_gives_a_message():
    out = run(str(AUDIO / SHORT_CLIPS[0]), language="vi")
    assert "English-only" in out["error"]


@pytest.mark.slow
def test_decoders_side_by_side_with_wer_and_trees():
    name = SHORT_CLIPS[0]
    out = run(str(AUDIO / name), decoders=("beam", "greedy"), reference=CLIPS[name]["reference"])
    assert out["error"] == ""
    assert [t["decoder"] for t in out["traces"]] == ["greedy", "beam"]  # always in the fixed order
    assert out["results"].count("<tr data-decoder=") == 2 and "%</td>" in out["results"]
    visible = [out[f"tree_{i}"]["visible"] for i in range(len(DECODERS))]
    assert visible == [True, True] + [False] * (len(DECODERS) - 2)
    steps = max(len(t["steps"]) for t in out["traces"])
    assert out["step"]["maximum"] == steps
    first = show_step(out["traces"], 1)["tree_1"]["value"]
    beam = WhisperTrace.from_dict(out["traces"][1])
    drawn = sum(len(t.x) for t in first.data if t.mode == "markers+text")
    assert drawn == len(shown_nodes(beam, 0)) == 1 + len(beam.steps[0].candidates)


def test_beam_figure_hover_and_persistent_nodes():
    from decoders.whisper.trace import BeamNode, BeamStep, FinalCandidate

    nodes = [BeamNode(0, -1, -1, -1, "", 0.0, 0.0, "root"),
             BeamNode(1, 0, 0, 10, " he", -0.1, -0.1, "kept"), BeamNode(2, 0, 0, 11, " she", -2.5, -2.5, "dropped"),
             BeamNode(3, 1, 1, 50256, "<|endoftext|>", -0.2, -0.3, "finished", eot_gap=0.4),
             BeamNode(4, 1, 1, 12, " was", -1.9, -2.0, "kept")]
    steps = [BeamStep(0, [1, 2], [1]), BeamStep(1, [3, 4], [4], [3])]
    trace = WhisperTrace("beam", "standard beam search (Whisper's own)", {}, "whisper-tiny.en", "en",
                         {"seconds": 1.0}, [50257], nodes, steps, [FinalCandidate(3, [10], "he", -0.3, 1, -0.3)],
                         [10], "he", 0.5)
    assert shown_nodes(trace, 1) == [0, 1, 3, 4]  # the dropped " she" of step 0 is gone at step 1
    fig = beam_figure(trace, 1)
    hover = " ".join(h for t in fig.data if t.hovertext for h in t.hovertext)
    assert "log p(EOT) − best other token = 0.400" in hover and "cumulative log p (search score) = -2.00" in hover
    names = {t.name for t in fig.data}
    assert {BEAM_LABELS["finished"], BEAM_LABELS["kept"], "chosen transcript"} <= names
    other_nodes = [BeamNode(0, -1, -1, -1, "", 0.0, 0.0, "root"), BeamNode(1, 0, 0, 11, " she", -0.1, -0.1, "kept")]
    other = WhisperTrace("greedy", "greedy", {}, "whisper-tiny.en", "en", {"seconds": 1.0}, [50257], other_nodes,
                         [BeamStep(0, [1], [1])], [FinalCandidate(1, [11], "she", -0.1, 1, -0.1)], [11], "she", 0.5)
    compared = beam_figure(trace, 1, other, steps_shown=9)
    assert "leaves greedy at step 1: &#x27; he&#x27; for &#x27; she&#x27;" in compared.layout.title.text
    assert list(compared.layout.xaxis.range) == [-0.4, 9 + 1.6]  # the click's longest search, shared by every tree
    assert "leaves" not in beam_figure(trace, 1, trace).layout.title.text  # the same transcript: no note


def test_a_one_step_search_gives_a_slider_gradio_accepts(monkeypatch):
    """Gradio refuses a slider with minimum == maximum (the step slider starts at 1): one step must not crash."""
    import decoders.whisper.jobs as jobs

    real = jobs.transcribe

    def one_step(clip, options, should_stop=None):
        trace = real(clip, options, should_stop=should_stop)
        trace.steps = trace.steps[:1]
        return trace

    monkeypatch.setattr(jobs, "transcribe", one_step)
    out = run(str(AUDIO / SHORT_CLIPS[0]), decoders=("greedy",))
    assert not out["error"]
    assert out["step"]["maximum"] > 1 and out["step"]["value"] == 1 and out["step"]["visible"] is False


def test_a_recorded_set_replays_what_was_transcribed_and_bad_files_say_why(tmp_path, capsys):
    from decoders.trace import TraceError
    from decoders.whisper.record import WhisperSet, main

    out = tmp_path / "set.json"
    assert main(["--clip", str(AUDIO / "librivox-0930.wav"), "--decoders", "greedy,beam", "--out", str(out)]) == 0
    recorded = WhisperSet.from_json(out.read_text())
    assert recorded.clip == "librivox-0930.wav" and recorded.reference == CLIPS["librivox-0930.wav"]["reference"]
    assert [t.decoder for t in recorded.traces] == ["greedy", "beam"]
    assert recorded.traces[0].output_ids == run(AUDIO / "librivox-0930.wav")["traces"][0]["output_ids"]  # greedy
    for text, message in (("{", "not a JSON file"), ('{"format": "x"}', "not a recorded Whisper set"),
                          ('{"format": "speclab-whisper-set", "version": 9}', "version 9"),
                          ('{"format": "speclab-whisper-set", "version": 1, "traces": []}', "at least one trace")):
        with pytest.raises(TraceError, match=message):
            WhisperSet.from_json(text)
    assert main(["--clip", str(tmp_path / "missing.wav"), "--out", str(tmp_path / "x.json")]) == 2
    assert "no such audio file" in capsys.readouterr().err
