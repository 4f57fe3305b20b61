"""The walkthrough: every ready lesson draws from its recorded trace without a model, and "try it" sets the
Generate tab's controls to that trace's settings."""
from __future__ import annotations

import pytest
import transformers

import decoders.runtime.models
from app.tabs.learn import lessons as teach
from app.tabs.generate.controls import EXAMPLE_CONTROLS


@pytest.fixture()
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a lesson tried to load a model")
    monkeypatch.setattr(decoders.runtime.models, "load_model", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def test_six_to_ten_lessons_and_every_figure_kind_exists():
    assert 6 <= len(teach.LESSONS) <= 11  # issue 9's eight + issue 26's self-drafting + issue 34's suffix + issue 45's training lesson
    for lesson in teach.LESSONS:
        assert lesson.figure in teach.FIGURES
        assert lesson.coming or lesson.trace or lesson.figure == "speedup"


@pytest.mark.parametrize("lesson", teach.ready(), ids=lambda lesson: lesson.title)
def test_every_ready_lesson_renders_its_picture_from_the_recorded_trace(lesson, no_model_loads):
    if lesson.trace:
        assert (teach.TRACES / lesson.trace).is_file()
    fig = teach.lesson_figure(lesson)
    assert len(fig.data) > 0, "a lesson's picture must draw something, not a placeholder"
    assert fig.layout.meta, "every picture carries a text alternative"


@pytest.mark.parametrize("lesson", [lesson for lesson in teach.ready() if teach.runs_in_generate(lesson)],
                         ids=lambda lesson: lesson.title)
def test_try_it_loads_the_trace_s_prompt_and_settings(lesson):
    trace = teach.lesson_trace(lesson)
    states = teach.try_states(lesson)
    assert set(states) == set(EXAMPLE_CONTROLS)
    assert states["prompt"]["value"] == trace.prompt
    for name in ("model", "method", "temperature", "seed"):
        assert states[name]["value"] == trace.options[name]
    if trace.options["method"] == "speculative":
        assert states["drafter"]["value"] == trace.options["drafter"]
        assert states["rule"]["value"] == trace.options["rule"]
    if trace.options.get("drafter") in ("eagle2", "ddd"):  # the tree's shape and what grew it come along
        for name in ("tree_k", "tree_depth", "tree_m"):
            assert states[name]["value"] == trace.options[name]
        assert (states["eagle_head"]["value"] == "auto") == (trace.options["eagle_head"] is not None)


def test_the_tree_and_beam_lessons_draw_real_recorded_runs(no_model_loads):
    trees = next(lesson for lesson in teach.ready() if lesson.title.startswith("5."))
    trace = teach.lesson_trace(trees)
    assert trace.options["drafter"] == "eagle2" and all(r.search for r in trace.rounds[:-1])
    assert "candidates" in teach.lesson_figure(trees).layout.title.text
    beams = next(lesson for lesson in teach.ready() if lesson.title.startswith("6."))
    forest = teach.lesson_trace(beams)
    assert forest.method == "dsbd" and forest.iterations
    assert not teach.runs_in_generate(beams) and "Beams" in beams.text  # beams run on their own tab
    assert "iteration" in teach.lesson_figure(beams).layout.title.text


def test_every_lesson_has_landed_and_a_coming_one_draws_a_notice_not_a_figure():
    assert [lesson.title for lesson in teach.LESSONS if lesson.coming] == []  # issue 9's eight lessons
    coming = teach.Lesson("10. Later", "Later", "text", "tree", coming="needs a recorded trace")
    fig = teach.lesson_figure(coming)
    assert len(fig.data) == 0 and "Coming" in fig.layout.annotations[0].text
    assert "coming: needs a recorded trace" in teach.contents_markdown([*teach.LESSONS, coming])
    assert teach.ready([*teach.LESSONS, coming]) == teach.LESSONS


def _whisper_lesson() -> teach.Lesson:
    return next(lesson for lesson in teach.ready() if lesson.figure == "whisper")


def test_the_whisper_lesson_tells_what_its_recording_shows(no_model_loads):
    """The lesson's sentences are about this recording: greedy writes 'old-sposed', beam search keeps 'ill' alive
    though 'old' led when greedy chose, 'ill' leads one token later and wins with a lower WER."""
    from decoders.whisper.wer import wer

    lesson = _whisper_lesson()
    recorded = teach.lesson_trace(lesson)
    greedy, beam = (next(t for t in recorded.traces if t.decoder == d) for d in ("greedy", "beam"))
    assert "old-sposed" in greedy.output_text and "ill-disposed" in beam.output_text
    assert "old-sposed" in lesson.text and "ill-disposed" in lesson.text
    assert wer(recorded.reference, beam.output_text) < wer(recorded.reference, greedy.output_text)

    def kept_texts(step):  # the live beams' last tokens, best first
        return [beam.nodes[n].text.strip() for n in sorted(beam.steps[step].kept, key=lambda n: -beam.nodes[n].score)]
    choice = next(i for i in range(len(beam.steps)) if "ill" in kept_texts(i))
    assert kept_texts(choice)[:2] == ["old", "ill"]  # old led when greedy chose; beam search kept both
    leader = max(beam.steps[choice + 1].kept, key=lambda n: beam.nodes[n].score)
    assert beam.nodes[beam.nodes[leader].parent].text.strip() == "ill"  # one token later ill- leads


def test_the_whisper_lesson_draws_beam_search_leaving_greedy_and_lists_the_transcripts(no_model_loads):
    from app.figures.whisper import DIVERGED_NAME

    lesson = _whisper_lesson()
    assert not teach.runs_in_generate(lesson)
    fig = teach.lesson_figure(lesson)
    assert "standard beam search" in fig.layout.title.text
    assert any(t.name == DIVERGED_NAME for t in fig.data)  # greedy is the first decoder
    table = teach.lesson_table(lesson)
    assert "sposed" in table and "disposed" in table and "WER" in table and ">0.0%</td>" in table
    assert teach.lesson_table(teach.ready()[0]) == ""


def test_the_whisper_lesson_s_try_it_loads_its_clip_and_decoders():
    lesson = _whisper_lesson()
    states = teach.whisper_try_states(lesson)
    recorded = teach.lesson_trace(lesson)
    assert states["example"]["value"] == recorded.clip and states["audio"]["value"].endswith(recorded.clip)
    assert states["reference"]["value"] == recorded.reference != ""
    assert states["decoders"]["value"] == [t.decoder for t in recorded.traces]


def test_a_lesson_is_a_one_entry_change(tmp_path):
    extra = teach.Lesson("9. Extra", "Extra", "text", "tree", "lookup-code-edit.json")
    lessons = [*teach.LESSONS, extra]
    assert teach.ready(lessons)[-1] is extra
    assert "9. Extra" in teach.contents_markdown(lessons)
    assert len(teach.lesson_figure(extra).data) > 0


def test_try_it_without_a_trace_says_what_to_add():
    with pytest.raises(ValueError, match="add `trace=`"):
        teach.try_settings(teach.Lesson("x", "x", "text", "speedup"))


def test_the_speedup_figure_follows_leviathan():
    fig = teach.speedup_figure()
    free = next(t for t in fig.data if t.name == "α = 0.9, c = 0.0")
    assert free.y[0] == pytest.approx(1.9)  # γ = 1: 1 + α
    costly = next(t for t in fig.data if t.name == "α = 0.9, c = 0.3")
    assert costly.y[0] == pytest.approx(1.9 / 1.3)


def test_the_learn_tab_builds_with_its_buttons_wired():
    import gradio as gr

    with gr.Blocks() as demo:
        controls = {name: gr.Textbox(label=name) for name in EXAMPLE_CONTROLS}
        whisper = {"audio": gr.Audio(type="filepath"), "example": gr.Dropdown(["librivox-0880.wav"]),
                   "reference": gr.Textbox(), "decoders": gr.CheckboxGroup(["greedy", "beam", "filter-ends",
                                                                            "min-lookahead"])}
        teach.build(controls, whisper)
    labels = [getattr(block, "value", None) for block in demo.blocks.values() if isinstance(block, gr.Button)]
    assert labels.count("Try it: load these settings into the Generate tab") == \
        len([lesson for lesson in teach.ready() if teach.runs_in_generate(lesson)])
    assert "Sample 1,000 times" in labels
    targets = {id(c) for c in controls.values()}
    wired = [dep for dep in demo.fns.values() if targets <= {id(o) for o in dep.outputs}]
    assert len(wired) == labels.count("Try it: load these settings into the Generate tab")
    values = wired[0].fn()  # the first lesson's "try it", as the page calls it
    assert len(values) == len(EXAMPLE_CONTROLS) + 1
    assert values[EXAMPLE_CONTROLS.index("method")]["value"] == teach.lesson_trace(teach.ready()[0]).options["method"]
    assert "Generate" in values[-1]
    heard = {id(c) for c in whisper.values()}
    whisper_wired = [dep for dep in demo.fns.values() if heard <= {id(o) for o in dep.outputs}]
    assert len(whisper_wired) == 1 and "Try it: load this clip and these decoders into the Whisper tab" in labels
    audio, example, reference, chosen, note = whisper_wired[0].fn()
    assert example["value"] == "librivox-0880.wav" and "beam" in chosen["value"] and "Whisper" in note


def test_the_beams_lesson_try_it_fills_the_beams_tab_with_the_recorded_settings(no_model_loads):
    """Lesson 6 gets its "Try it" like the others: the Beams tab's controls take the recorded run's settings, and
    those settings are ones the tab accepts."""
    import gradio as gr

    from app.tabs import beams as beams_tab

    lesson = next(lesson for lesson in teach.ready() if lesson.figure == "forest")
    values = teach.beams_try_values(lesson)
    trace = teach.lesson_trace(lesson)
    assert values["prompt"] == trace.prompt and values["method"] == trace.method == "dsbd"
    options = beams_tab.options_for(values["method"], values["model"], values["draft"], values["width"],
                                    values["gamma"], values["thres"], values["min_width"], values["memory"],
                                    values["max_tokens"], values["seed"])
    assert (options.width, options.gamma, options.max_new_tokens) == (trace.options["width"], trace.options["gamma"],
                                                                      trace.options["max_new_tokens"])
    with gr.Blocks() as demo:
        controls = beams_tab.build()
        teach.build({name: gr.Textbox() for name in teach.EXAMPLE_CONTROLS}, None, controls)
    buttons = [b for b in demo.blocks.values() if isinstance(b, gr.Button) and "Beams tab" in str(b.value)]
    assert len(buttons) == 1
