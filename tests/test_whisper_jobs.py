"""The Whisper tab's Transcribe as Gradio wires it: each decoder decodes once per click, the step slider redraws
from the stored traces without decoding, the click holds the decode slot, Stop and a page that goes away end the
decode at its next step (thread gone, slot free), and a stopped real decode leaves no cache hooks behind."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("whisper")

import gradio as gr  # noqa: E402
from whisper_helpers import AUDIO, CLIPS, SHORT_CLIPS, TINY, clip  # noqa: E402

import decoders.whisper.jobs as jobs  # noqa: E402
from app.shared.decode_slot import DECODE_SLOT  # noqa: E402
from app.shared.session import RunSession  # noqa: E402
from app.tabs.whisper import build, handlers  # noqa: E402
from decoders.whisper.options import WhisperOptions  # noqa: E402
from decoders.whisper.task import Cancelled, transcribe  # noqa: E402


def wired(api_name: str):
    """The function Gradio calls for this event of the Whisper tab (as the page wires it)."""
    with gr.Blocks() as demo:
        build()
    return next(f.fn for f in demo.fns.values() if f.api_name == api_name)


def inputs(decoders=("greedy", "beam"), session=None) -> list:
    name = SHORT_CLIPS[0]
    return [str(AUDIO / name), CLIPS[name]["reference"], TINY, "en", list(decoders), 3, 1.0, 2, "min",
            session or RunSession()]


@pytest.fixture
def counted(monkeypatch):
    """Count real decodes (one per decoder run) and tree drawings; note whether the decode slot was held."""
    calls = {"decodes": 0, "figures": 0, "slot_held": []}
    real_transcribe, real_figure = jobs.transcribe, handlers.beam_figure

    def transcribe_counted(clip, options, should_stop=None):
        calls["decodes"] += 1
        calls["slot_held"].append(DECODE_SLOT.locked())
        return real_transcribe(clip, options, should_stop=should_stop)

    def figure_counted(*args, **kwargs):
        calls["figures"] += 1
        return real_figure(*args, **kwargs)

    monkeypatch.setattr(jobs, "transcribe", transcribe_counted)
    monkeypatch.setattr(handlers, "beam_figure", figure_counted)
    return calls


def test_a_click_decodes_each_decoder_once_and_the_slider_only_redraws(counted):
    outputs = list(wired("whisper_transcribe")(*inputs(("greedy", "beam"))))
    assert counted["decodes"] == 2  # the old wiring called the whole transcription once per output (10x)
    assert counted["slot_held"] == [True, True]
    traces = outputs[-1][handlers.OUTPUTS.index("traces")]
    assert [t["decoder"] for t in traces] == ["greedy", "beam"]
    assert counted["figures"] == 2  # one tree per decoder, drawn once
    trees = wired("whisper_step")(traces, 1)
    assert counted["decodes"] == 2 and counted["figures"] == 4  # the slider: no decode, each tree drawn once
    assert len(trees) == len(handlers.TREES) and trees[0]["visible"] and not trees[2]["visible"]


def test_a_click_waits_for_the_decode_slot(counted):
    done = threading.Event()

    def click():
        list(wired("whisper_transcribe")(*inputs(("greedy",))))
        done.set()

    with DECODE_SLOT.hold():  # another tab's run (a race being timed)
        worker = threading.Thread(target=click, daemon=True)
        worker.start()
        time.sleep(1.5)
        assert counted["decodes"] == 0 and not done.is_set()
    worker.join(timeout=120)
    assert done.is_set() and counted["decodes"] == 1


@pytest.fixture
def endless(monkeypatch):
    """A decode that runs until asked to stop, one 'step' per 20 ms, as task.transcribe's StopCheck would."""
    seen = {"started": threading.Event(), "stopped": threading.Event()}

    def forever(clip, options, should_stop=None):
        seen["started"].set()
        while not should_stop():
            time.sleep(0.02)
        seen["stopped"].set()
        raise Cancelled("stopped")

    monkeypatch.setattr(jobs, "transcribe", forever)
    monkeypatch.setattr(jobs, "POLL", 0.05)
    return seen


def whisper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("whisper-") and t.is_alive()]


def test_stop_ends_the_running_decode_and_frees_the_slot(endless):
    session, outputs = RunSession(), []
    worker = threading.Thread(target=lambda: outputs.extend(wired("whisper_transcribe")(*inputs(session=session))),
                              daemon=True)
    worker.start()
    assert endless["started"].wait(60)
    status = wired("whisper_stop")(session)
    assert "Stopping" in status[0]
    worker.join(timeout=10)
    assert not worker.is_alive() and endless["stopped"].is_set()
    assert "stopped before any decoder finished" in outputs[-1][0]
    assert not whisper_threads() and not DECODE_SLOT.locked() and not session.running


def test_a_page_that_goes_away_closes_the_decode(endless):
    """Gradio closes the event's generator when its client disconnects (queueing.reset_iterators): that must end
    the decode thread at once and free the slot, so the next visitor's job is not queued behind a ghost."""
    session = RunSession()
    click = wired("whisper_transcribe")(*inputs(session=session))
    for output in click:
        if "decoding with" in str(output[0]):
            break
    assert endless["started"].is_set() and DECODE_SLOT.locked()
    click.close()
    assert endless["stopped"].is_set() and not whisper_threads()
    assert not DECODE_SLOT.locked() and not session.running


def test_a_stopped_real_decode_raises_cancelled_and_leaves_no_cache_hooks():
    from decoders.whisper.models import load_whisper

    steps = []

    def after_three_steps() -> bool:
        steps.append(1)
        return len(steps) > 3

    with pytest.raises(Cancelled):
        transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(decoder="min-lookahead", beam_size=3),
                   should_stop=after_three_steps)
    model = load_whisper(TINY)
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0  # the task's kv-cache hooks were removed
    trace = transcribe(clip(SHORT_CLIPS[0]), WhisperOptions(decoder="greedy"))  # the model still decodes
    assert trace.output_text


def test_stop_cancels_a_queued_click_before_it_decodes(endless):
    """A click waiting in Gradio's queue (admitted by the validator) returns without decoding after a Stop."""
    session = RunSession()
    session.admit()  # what the event's validator does when Gradio queues the click
    wired("whisper_stop")(session)
    outputs = list(wired("whisper_transcribe")(*inputs(session=session)))
    assert "nothing ran" in outputs[-1][0] and not endless["started"].is_set()


def test_closing_a_decode_that_ignores_its_stop_check_is_bounded(monkeypatch):
    """Review 14d8f23 #7: closing a transcription joined its worker without a bound, so one decode stuck in a step
    blocked whoever closed it (a Stop, the slot taking an abandoned run over, the exit hook). Now the join waits
    JOIN_WAIT seconds and the transcription says it is still busy (the slot counts that as computing)."""
    release, started = threading.Event(), threading.Event()

    def stubborn(clip, options, should_stop=None):
        started.set()
        release.wait(30)  # a step that does not look at should_stop
        raise Cancelled("stopped late")

    monkeypatch.setattr(jobs, "transcribe", stubborn)
    monkeypatch.setattr(jobs, "POLL", 0.05)
    monkeypatch.setattr(jobs, "JOIN_WAIT", 0.3, raising=False)  # older code had no bound to set
    job = jobs.transcribe_each(clip(SHORT_CLIPS[0]), [WhisperOptions(model=TINY, decoder="greedy")])
    try:
        for item in job:
            if getattr(item, "phase", "") == "decoding":
                break
        assert started.is_set()
        closer = threading.Thread(target=job.close, daemon=True)
        closer.start()
        closer.join(3)
        assert not closer.is_alive(), "close() waited for a decode that ignores its stop check"
        assert job.busy()
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while job.busy() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not job.busy() and not whisper_threads()
