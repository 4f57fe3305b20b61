"""The Whisper tab's handlers: one click = one pass over the chosen decoders, streamed as dicts of output name ->
value (layout.py turns them into Gradio's tuples; tests call them without a browser).

A click holds the one-decode-at-a-time slot (app/shared/decode_slot.py) from loading the model to the last
decoder, so no race is timed while Whisper decodes. The decode itself runs in decoders.whisper.jobs, which reports
progress every second: that is when Stop (this tab's RunSession) and a page that went away (Gradio closes the
job's generator) are noticed, and closing it ends the running decode at its next step with its caches freed.
"""
from __future__ import annotations

import html
import json
from typing import Iterator

import gradio as gr

from app.figures.whisper import beam_figure, results_html
from app.shared.decode_slot import DECODE_SLOT
from app.shared.paths import ASSETS
from app.shared.session import RunSession
from decoders.whisper.registry import DECODERS as DECODER_SPECS

AUDIO_DIR = ASSETS / "audio"
DECODERS = tuple(DECODER_SPECS)  # the registry's names, in its order (decoders/whisper/registry.py)
# greedy is in: on the default clip it is the decoder that errs ("old-sposed"), which is the lesson beam search
# teaches. Min Lookahead is one tick away (5-10x beam's time: too slow for a first click on 2 cores).
DEFAULT_DECODERS = ["greedy", "beam", "filter-ends"]
DEFAULT_CLIP = "librivox-0880.wav"
LANGUAGES = {"en": "English", "vi": "Vietnamese", "fr": "French", "de": "German", "es": "Spanish",
             "it": "Italian", "pt": "Portuguese", "nl": "Dutch", "zh": "Chinese", "ja": "Japanese"}
TREES = tuple(f"tree_{i}" for i in range(len(DECODERS)))
OUTPUTS = ("status", "error", "results", "traces", "step") + TREES
RUN_INPUTS = ("audio", "reference", "model", "language", "decoders", "beam_size", "eot_margin", "depth", "aggregate")


def example_clips() -> dict[str, dict]:
    try:
        return json.loads((AUDIO_DIR / "clips.json").read_text())
    except (OSError, ValueError):
        return {}


def pick_example(name: str | None) -> tuple:
    clips = example_clips()
    if not name or name not in clips:
        return gr.skip(), gr.skip()
    return str(AUDIO_DIR / name), clips[name]["reference"]


def run(audio, reference: str, model: str, language: str, decoders: list[str], beam_size, eot_margin, depth,
        aggregate: str, session: RunSession | None = None) -> Iterator[dict]:
    """The Transcribe button: every chosen decoder once, in the fixed order; progress, then results as each decoder
    finishes, then the trees. Errors become one-line messages."""
    from decoders.options import OptionsError
    from decoders.whisper.audio import AudioError

    session = session if session is not None else RunSession()
    try:
        clip, options = _prepare(audio, model, language, decoders, beam_size, eot_margin, depth, aggregate)
    except (AudioError, OptionsError) as err:
        yield _error(str(err))
        return
    if not session.begin():
        yield {**_skip(), "status": "Cancelled: Stop was pressed while this run waited; nothing ran.", "error": ""}
        return
    try:
        yield from _transcribe(clip, options, reference or "", session)
    finally:
        session.end()


def _prepare(audio, model, language, decoders, beam_size, eot_margin, depth, aggregate):
    from decoders.options import OptionsError
    from decoders.whisper.audio import load_file, prepare
    from decoders.whisper.options import WhisperOptions
    from decoders.whisper.registry import decoder as decoder_spec

    from app.shared.boxes import refuse_out_of_range

    refuse_out_of_range((beam_size, eot_margin, depth))
    if audio is None:
        raise OptionsError("Record or upload a clip first (or pick an example).")
    if not decoders:
        raise OptionsError("Choose at least one decoder.")
    for name in decoders:
        decoder_spec(name)  # an unknown name raises, listing the known ones
    options = [WhisperOptions(model=model, decoder=d, language=language, beam_size=int(beam_size),
                              eot_margin=float(eot_margin), lookahead_depth=int(depth),
                              lookahead_aggregate=aggregate).validate()
               for d in sorted(decoders, key=DECODERS.index)]
    clip = prepare(audio[1], audio[0]) if isinstance(audio, tuple) else load_file(audio)
    return clip, options


def _transcribe(clip, options: list, reference: str, session: RunSession) -> Iterator[dict]:
    from decoders.options import OptionsError
    from decoders.whisper.audio import AudioError
    from decoders.whisper.models import ModelError

    head = f"{clip.name}: {clip.seconds:.1f} s at {clip.source_rate} Hz · {options[0].model} · {options[0].language}"
    traces = []
    yield {"status": f"{head} · waiting for any run in another tab…", "error": ""}
    try:
        with DECODE_SLOT.queue(SLOT_NAME) as turn:
            for line in turn.lines(stop=session.stop_requested.is_set):
                yield {"status": f"{head} · {line}"}
            if turn.cancelled:
                yield {**_skip(), "status": f"{head} · stopped while it waited for its turn; nothing ran.", "error": ""}
                return
            yield from _decoded(clip, options, reference, session, head, traces, turn)
    except (AudioError, OptionsError, ModelError) as err:
        yield _error(str(err))
        return
    except Exception as err:  # never a traceback on the page
        yield _error(f"Unexpected error ({type(err).__name__}): {err}")
        return
    if not traces:
        yield {**_skip(), "status": f"{head} · stopped before any decoder finished.", "error": ""}
        return
    stopped = session.stop_requested.is_set()
    yield _finished(traces, reference, head + (" · stopped: showing the decoders that finished" if stopped else ""))


SLOT_NAME = "a Whisper transcription"  # what it is called to the runs waiting behind it (app/shared/decode_slot.py)


def _decoded(clip, options: list, reference: str, session: RunSession, head: str, traces: list, turn
             ) -> Iterator[dict]:
    """Progress and each decoder's results as it finishes (into `traces`), inside the slot (`turn`: this run's
    place in its line), until Stop."""
    from decoders.whisper.jobs import Progress, transcribe_each

    with DECODE_SLOT.hold(transcribe_each(clip, options), turn=turn) as lease:
        for item in lease.items():
            if session.stop_requested.is_set():
                return  # leaving the block closes the decode: it ends at its next step, caches freed
            if isinstance(item, Progress):
                yield {"status": f"{head} · {_progress_text(item)}"}
            else:
                traces.append(item)
                yield {"status": f"{head} · {item.label} done ({len(traces)} of {len(options)})",
                       "results": results_html(traces, reference)}


def _progress_text(item) -> str:
    if item.phase == "loading":
        return f"loading {html.escape(item.label)} (converted once on first use)…"
    return f"decoding with {item.label} ({item.index + 1} of {item.total}), {item.seconds:.0f} s…"


def _finished(traces: list, reference: str, status: str) -> dict:
    steps = max(len(t.steps) for t in traces)
    return {"status": status, "error": "", "results": results_html(traces, reference),
            "traces": [t.to_dict() for t in traces],
            # Gradio refuses a slider whose minimum equals its maximum: a one-step search gets 1..2, hidden.
            "step": gr.update(maximum=max(2, steps), value=steps, visible=steps > 1), **trees(traces, steps - 1)}


def transcribe_all(audio, reference: str, model: str, language: str, decoders: list[str], beam_size=5,
                   eot_margin=1.0, depth=2, aggregate: str = "min", session: RunSession | None = None) -> dict:
    """A whole click as one dict (its updates merged, the last one winning): for tests and scripts."""
    merged: dict = {}
    for update in run(audio, reference, model, language, decoders, beam_size, eot_margin, depth, aggregate,
                      session=session):
        merged.update(update)
    return merged


def show_step(trace_dicts: list[dict] | None, step) -> dict:
    """The step slider: redraw every tree at that step from the traces in gr.State (no model, no decode)."""
    from decoders.whisper.trace import WhisperTrace

    traces = [WhisperTrace.from_dict(d) for d in trace_dicts or []]
    return trees(traces, int(step) - 1)


def stop(session: RunSession | None) -> dict:
    """Stop: the running transcription ends at its next decoding step and shows the decoders that finished;
    queued ones will not start."""
    if session is None or (not session.running and not session.queued):
        return {"status": gr.skip(), "error": ""}
    session.request_stop()
    return {"status": "Stopping at the next decoding step …", "error": ""}


def trees(traces: list, step: int) -> dict:
    """Every decoder's tree at `step`, on one shared step axis, each compared with the first decoder's transcript."""
    out, longest = {}, max((len(t.steps) for t in traces), default=0)
    for i, name in enumerate(TREES):
        if i < len(traces):
            figure = beam_figure(traces[i], step, traces[0] if i else None, steps_shown=longest)
            out[name] = gr.update(value=figure, visible=True)
        else:
            out[name] = gr.update(value=None, visible=False)
    return out


def _skip() -> dict:
    return {name: gr.skip() for name in OUTPUTS}


def _error(message: str) -> dict:
    return {**_skip(), "status": "", "error": f'<div class="sl-error" id="sw-error-msg">{html.escape(message)}</div>'}
