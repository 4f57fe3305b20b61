"""The Beams tab: beam search, beam sampling and DSBD (decoders/beams) on a prompt, with the forest of every
iteration, DSBD's D[W] per layer, beam scores over time and the ranked finished candidates (app/figures/forest.py).

The handlers return plain dicts (tests call them without a browser); each click computes once and the wiring
hands the one result to every output (`run_outputs`, `iteration_outputs`, `stop_outputs`). Models load with
`loading.loaded` inside the decode slot and stay held until the run ends. Stop: the beam runner does not poll a
stop request, so `run_beams` checks the tab's RunSession between iterations and closes the decoder's generator,
whose `finally` frees the caches."""
from __future__ import annotations

import time
from typing import Iterator

import gradio as gr

from app.shared.boxes import SCRUB, Bounded, Scrubber, refuse_out_of_range

from decoders.beams.trace import BeamTrace, BeamTraceError
from decoders.api import draft_for
from decoders.options import BEAM_METHODS, DecodeOptions, OptionsError

from app.shared.numbers import whole_number
from app.shared import loading
from app.shared.hosting import check_model_allowed, gpu, registry_only
from app.figures.forest import (DSBD_NOTE, candidates_html, forest_figure, scores_figure, summary_line,
                                width_figure)
from app.shared.session import RunSession
from app.shared.decode_slot import DECODE_SLOT, QUEUE_LIMIT

DEFAULT_MODEL = "smollm2-135m"
SAME_AS_PAIRING = "registry pairing"  # the draft box's default: the target's default draft (DSBD only)
MEMORY_MODES = {"all beams (one KV row each)": False, "one input beam (one KV row)": True}
OUTPUTS = ("status", "error", "forest", "width", "scores", "candidates", "iteration", "trace")
VIEWS = ("forest", "width", "scores")  # what the iteration slider redraws
STOP_OUTPUTS = ("status", "error")
STREAM_EVERY = 0.25  # s between two drawn iterations while a run streams (the last one is always drawn)

METHOD_HELP = """
**beam search**: every step keeps the `width` most likely continuations (cumulative log-probability); one target
forward per token, `width` KV rows.

**beam sampling**: every step draws `width` (beam, token) pairs from the beams' joint distribution; one target forward
per token, `width` KV rows.

**DSBD** (draft-based beam decoding): a draft model grows a forest of W draws per layer over γ layers; the target
scores the whole forest in one forward and keeps, layer by layer, the beams recursive rejection sampling accepts.
A layer's width K is the largest k the W drafts produce with probability at least thres (the D[W] chart). The
memory mode "one input beam" carries a single beam between iterations (one target KV row).
"""


def options_for(method: str, model: str, draft: str | None, width, gamma, thres, min_width, memory: str,
                max_tokens, seed) -> DecodeOptions:
    """The controls as validated DecodeOptions (OptionsError with the fix on bad input)."""
    refuse_out_of_range((width, gamma, thres, min_width, max_tokens))
    if method not in BEAM_METHODS:
        raise OptionsError(f"method must be one of {', '.join(BEAM_METHODS)}, got {method!r}")
    if memory not in MEMORY_MODES:
        raise OptionsError(f"memory mode must be one of: {', '.join(MEMORY_MODES)}")
    model = (model or "").strip()
    if not model:
        raise OptionsError("choose a model")
    draft = None if not draft or draft == SAME_AS_PAIRING or method != "dsbd" else draft.strip()
    if method == "dsbd" and draft is None and _pairing(model) is None:
        draft = model  # no smaller draft pairs with this model: it drafts for itself (self_draft_note says so)
    numbers = dict(width=whole_number(width, "width"), gamma=whole_number(gamma, "γ"),
                   min_width=whole_number(min_width, "min width"),
                   max_new_tokens=whole_number(max_tokens, "max tokens"), seed=whole_number(seed, "seed", 0))
    try:
        numbers["thres"] = float(thres)
    except (TypeError, ValueError):
        raise OptionsError(f"thres must be a number, got {thres!r}") from None
    return DecodeOptions(method=method, model=model, draft_model=draft, one_input_beam=MEMORY_MODES[memory],
                         temperature=0.0 if method == "beam-search" else 1.0, **numbers).validate()


def _pairing(model: str) -> str | None:
    """The registry's draft for `model`, None when it has none (or is not a registry model)."""
    try:
        return draft_for(DecodeOptions(model=model, method="dsbd", temperature=1.0))
    except (OptionsError, ImportError):
        return None


def self_draft_note(options: DecodeOptions) -> str:
    """A sentence when DSBD drafts with the target itself (no paired draft): why every draw is then accepted."""
    if options.method != "dsbd" or options.draft_model != options.model:
        return ""
    return (f"DSBD drafts with {options.model} itself (no smaller draft model pairs with it), so every draft is "
            "accepted; pick qwen2.5-coder-1.5b (its 0.5B draft) to see rejections. ")


def run_beams(prompt: str, model: str, draft: str, method: str, width, gamma, thres, min_width, memory: str,
              max_tokens, seed, session: RunSession | None = None) -> Iterator[dict]:
    """The Run button: validate, load, then stream the drawn iterations until the run ends or Stop is pressed."""
    session = session if session is not None else RunSession()
    if not (prompt or "").strip():
        yield _error("Type a prompt first.")
        return
    try:
        options = options_for(method, model, draft, width, gamma, thres, min_width, memory, max_tokens, seed)
        check_model_allowed(options.model)
        check_model_allowed(options.draft_model, "draft model")
        draft_name = loading.draft_name(options)
    except OptionsError as err:
        yield _error(str(err).replace("pass draft_model=... or pick", "choose one in 'Draft model (DSBD)', or pick"))
        return
    if not session.begin():
        yield {**_skip(), "status": "Cancelled: Stop was pressed while this run waited; nothing ran."}
        return
    note = self_draft_note(options)
    iterations = None
    try:
        loading.check_before_waiting(prompt, options)  # seconds: a model that cannot load here, a prompt over the cap
        yield {**_skip(), "status": note + f"Loading {options.model}" + (
            f" and {draft_name}" if draft_name and draft_name != options.model else "") + " (after any run in "
            "another tab) …", "error": ""}
        with DECODE_SLOT.queue(SLOT_NAME) as turn:
            for line in turn.lines(stop=session.stop_requested.is_set):
                yield {**_skip(), "status": note + line}
            if turn.cancelled:
                yield {**_skip(), "status": NOT_STARTED}
                return
            # loaded inside the slot, then held: no eviction before the decode
            with loading.loaded(options, turn=turn, stop=session.stop_requested.is_set):
                iterations = decode_iterations(options.to_dict(), prompt, draft_name)
                yield from _iterations(iterations, session, note)
    except (OptionsError, BeamTraceError, RuntimeError, ValueError, OSError, *loading.model_error_types()) as err:
        yield _error(str(err))
        return
    except Exception as err:  # never a traceback in the page
        yield _error(f"Unexpected error ({type(err).__name__}): {err}")
        return
    finally:
        if iterations is not None:
            iterations.close()
        session.end()
    trace = session.latest
    if trace is not None and session.stop_requested.is_set():
        trace.stop_reason = "cancelled"
        yield {**views(trace), "status": "Stopped. " + summary_line(trace)}


SLOT_NAME = "a Beams run"  # what a Beams run is called to the runs waiting behind it (app/shared/decode_slot.py)
NOT_STARTED = "Stopped before your run started: it was waiting for its turn; nothing ran."


def _iterations(iterations: Iterator[dict], session: RunSession, note: str) -> Iterator[dict]:
    """The drawn iterations until the run ends or Stop (the caller's finally then closes the decoder)."""
    for data in iterations:
        if "waiting" in data:  # another run took the slot between the load and the decode
            if session.stop_requested.is_set():
                return
            yield {**_skip(), "status": note + data["waiting"]}
            continue
        trace = BeamTrace.from_dict(data)
        session.latest = trace
        if session.stop_requested.is_set():
            return
        yield {**views(trace), "status": note + summary_line(trace)}


@gpu(duration=120)
def decode_iterations(options: dict, prompt: str, draft_name: str | None) -> Iterator[dict]:
    """Plain beam-trace dicts: at most one per STREAM_EVERY seconds, and always the last; before them, {"waiting":
    line} while another run holds the decode slot. Closing this generator closes the decoder's, whose `finally`
    frees every cache."""
    from decoders.api import stream

    opts = DecodeOptions.from_dict(options)

    def decoder():  # loads inside the slot that iterates it (cache hits: run_beams loaded them)
        target = loading.load(opts.model, opts)
        draft = loading.load_draft(draft_name, opts) if draft_name else None
        yield from stream(opts, prompt, target=target, draft=draft)

    trace, last = None, 0.0
    with DECODE_SLOT.queue(SLOT_NAME) as turn:
        for line in turn.lines():
            yield {"waiting": line}
        with DECODE_SLOT.hold(decoder(), turn=turn) as lease:
            for trace in lease.items():
                if time.monotonic() - last >= STREAM_EVERY:
                    yield trace.to_dict()
                    last = time.monotonic()
    if trace is not None:
        yield trace.to_dict()


def views(trace: BeamTrace, index: int | None = None) -> dict:
    count = len(trace.iterations)
    return {"status": summary_line(trace), "error": "", "forest": forest_figure(trace, index),
            "width": width_figure(trace, index), "scores": scores_figure(trace, index),
            "candidates": candidates_html(trace),
            # Gradio refuses a slider whose minimum equals its maximum: a one-iteration run keeps 1..2, hidden
            "iteration": gr.update(minimum=1, maximum=max(2, count), value=max(1, count), visible=count > 1),
            "trace": trace.to_dict()}


def show_iteration(trace_dict: dict | None, value) -> dict:
    """The iteration slider: redraw the views of one recorded iteration (1-based), without a model."""
    if not trace_dict:
        return {name: gr.skip() for name in VIEWS}
    trace = BeamTrace.from_dict(trace_dict)
    index = int(value) - 1 if value else None
    return {"forest": forest_figure(trace, index), "width": width_figure(trace, index),
            "scores": scores_figure(trace, index)}


def stop(session: RunSession | None) -> dict:
    """Stop: the running beam run ends at its next iteration and shows it; queued runs will not decode."""
    if session is None or (not session.running and not session.queued):
        return {"status": gr.skip(), "error": ""}
    session.request_stop()
    return {"status": "Stopping at the next iteration …", "error": ""}


def run_outputs(*args) -> Iterator[tuple]:
    """The Run button's wiring: one run_beams per click, each result spread over OUTPUTS (args end with the
    session)."""
    for result in run_beams(*args[:-1], session=args[-1]):
        yield tuple(result.get(n, gr.skip()) for n in OUTPUTS)


def iteration_outputs(trace_dict: dict | None, value) -> tuple:
    """The iteration slider's wiring: one show_iteration per move, spread over VIEWS."""
    views_now = show_iteration(trace_dict, value)
    return tuple(views_now[n] for n in VIEWS)


def stop_outputs(session: RunSession | None) -> tuple:
    """The Stop button's wiring: one stop per click, spread over STOP_OUTPUTS."""
    result = stop(session)
    return tuple(result[n] for n in STOP_OUTPUTS)


def _skip() -> dict:
    return {name: gr.skip() for name in OUTPUTS}


def _error(message: str) -> dict:
    """The message in the error box; the status line is cleared (no "Loading …" left above an error)."""
    import html

    return {**_skip(), "status": "",
            "error": f'<div class="sl-error" id="bm-error-msg">{html.escape(message)}</div>'}


def _model_choices() -> list[str]:
    try:
        from decoders.runtime.models import available_models

        return available_models()
    except ImportError:
        return [DEFAULT_MODEL]


def build() -> dict:
    """The tab's components and events; call inside a gr.Tab. Returns the controls by name (for the Learn tab's
    "Try it")."""
    models = _model_choices()
    gr.Markdown("Several beams at once: beam search, beam sampling, and DSBD (draft-based beam decoding, where a "
                "draft model proposes a forest and the target keeps the beams it accepts). DSBD needs a draft model: "
                "the Qwen2.5-Coder pair (1.5B target, 0.5B draft) when installed; a model without a paired draft "
                f"drafts for itself (every draw is then accepted). *{DSBD_NOTE}*", elem_id="bm-intro")
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            prompt = gr.Textbox("Write a Python function that reverses a string.", lines=3, label="Prompt",
                                elem_id="bm-prompt")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="bm-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="bm-stop")
        with gr.Column(scale=2, min_width=320):
            method = gr.Radio(list(BEAM_METHODS), value="beam-sampling", label="Method", elem_id="bm-method")
            model = gr.Dropdown(models, value=DEFAULT_MODEL if DEFAULT_MODEL in models else models[0],
                                label="Target model", allow_custom_value=not registry_only(), elem_id="bm-model")
            draft = gr.Dropdown([SAME_AS_PAIRING] + models, value=SAME_AS_PAIRING, label="Draft model (DSBD)",
                                allow_custom_value=not registry_only(), elem_id="bm-draft")
        with gr.Column(scale=2, min_width=320):
            width = Bounded(1, 8, value=4, step=1, label="width (beams; DSBD: W draws per layer)")
            gamma = Bounded(1, 8, value=4, step=1, label="γ (DSBD: draft layers per iteration)")
            thres = Bounded(0.05, 1.0, value=0.7, step=0.05, label="thres (DSBD: width cut on P(A ≥ K))")
            min_width = Bounded(1, 8, value=1, step=1, label="min width (DSBD: K_min)")
            memory = gr.Radio(list(MEMORY_MODES), value=next(iter(MEMORY_MODES)), label="memory mode (DSBD)")
            max_tokens = Bounded(1, 256, value=48, step=1, label="max tokens")
            seed = gr.Number(0, precision=None, label="seed")  # what was typed: 1.5 is refused, not rounded
    out = {"status": gr.Markdown("", elem_id="bm-status"), "error": gr.HTML("", elem_id="bm-error"),
           "iteration": Scrubber(1, 2, value=1, step=1, elem_classes=SCRUB, label="iteration (scrub through the run)", visible=False,
                                  elem_id="bm-iteration"),
           "forest": gr.Plot(forest_figure(None), label="beam forest", elem_id="bm-forest")}
    with gr.Row(equal_height=False):  # min_width: on a phone (420 px) the two panels stack instead of squeezing
        with gr.Column(scale=1, min_width=400):
            out["width"] = gr.Plot(width_figure(None), label="D[W] and the chosen width", elem_id="bm-width")
        with gr.Column(scale=1, min_width=400):
            out["scores"] = gr.Plot(scores_figure(None), label="beam ranking scores", elem_id="bm-scores")
    out["candidates"] = gr.HTML(candidates_html(None), elem_id="bm-candidates-box")
    out["trace"] = gr.State(None)
    with gr.Accordion("What each method does", open=False):
        gr.Markdown(METHOD_HELP, elem_id="bm-help")
    session = gr.State(RunSession())  # this tab's runs, for Stop; per browser session, server-side
    outs = [out[n] for n in OUTPUTS]
    inputs = [prompt, model, draft, method, width, gamma, thres, min_width, memory, max_tokens, seed, session]

    run.click(run_outputs, inputs, outs, concurrency_limit=QUEUE_LIMIT, concurrency_id="beams", api_name="beams_run")
    stop_btn.click(stop_outputs, [session], [out[n] for n in STOP_OUTPUTS], api_name="beams_stop")
    out["iteration"].input(iteration_outputs, [out["trace"], out["iteration"]], [out[n] for n in VIEWS],
                           trigger_mode="always_last", api_name="beams_iteration")
    return {"prompt": prompt, "model": model, "draft": draft, "method": method, "width": width, "gamma": gamma,
            "thres": thres, "min_width": min_width, "memory": memory, "max_tokens": max_tokens, "seed": seed}
