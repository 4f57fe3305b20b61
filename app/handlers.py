"""Event handlers for the Generate tab: UI values -> DecodeOptions -> the core's rounds -> rendered views.

Handlers return dicts keyed by the names in views.OUTPUTS; ui.py turns them into tuples for Gradio. Models are
the only process-wide objects (decoders.models caches them); a user's trace lives in gr.State.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import gradio as gr

from decoders.api import draft_for
from decoders.options import DecodeOptions, OptionsError
from decoders.trace import Trace, TraceError

from .hosting import gpu
from .render_text import round_of_span
from .views import error_html, full_views, read_trace_file, round_views, slider_update, write_trace_file

# One generation at a time, process-wide. The layer-skip drafter temporarily swaps decoder layers out of the
# *shared, cached* target model while it drafts, so a second run on the same model at the same moment would see
# a half-skipped model; timings of concurrent runs would also be meaningless on a 2-core CPU. The Run and Race
# events share one Gradio concurrency group of size 1 (ui.py) and this lock guards any other caller.
DECODE_LOCK = threading.Lock()

# The controls of the Generate tab, in the order ui.py passes them.
RUN_INPUTS = ("prompt", "model", "dtype", "method", "drafter", "draft_model", "rule", "gamma", "max_draft", "lam",
              "ngram", "skip_layers", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "chat", "live")
DEFAULT_DRAFT = "(registry pairing)"
STREAM_EVERY = 0.4  # seconds between streamed updates: each one costs drawing time (server and browser)
STOP_WAIT = 15.0  # seconds Stop waits for the run to notice the flag and close (one round, or a model load)
STOP_POLL = 1.0  # with live drawing off, the decoder still reports this often so a Stop is noticed

# Per browser session: a stop flag for the run in flight, an event set once it has closed, and the latest trace it
# streamed. Stop sets the flag; the run notices it at its next update, closes the decoder (whose `finally` frees
# the caches) and shows the partial run itself, so its last view cannot be overwritten by a late update.
_STOPS: dict[str, threading.Event] = {}
_CLOSED: dict[str, threading.Event] = {}
_LATEST: dict[str, Trace] = {}


def options_from(values: dict) -> DecodeOptions:
    """Map control values one-to-one onto DecodeOptions and validate (raises OptionsError)."""
    skip = None
    text = str(values.get("skip_layers") or "").strip()
    if text and values.get("method") == "speculative" and values.get("drafter") == "layer-skip":
        try:
            skip = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        except ValueError:
            raise OptionsError(f"layers to skip must be comma-separated whole numbers like 9,11,13; got {text!r}") \
                from None
    draft = values.get("draft_model")
    is_draft_model = values.get("method") == "speculative" and values.get("drafter") == "draft-model"
    options = DecodeOptions(
        model=str(values.get("model") or DecodeOptions.model), method=values.get("method") or "baseline",
        drafter=values.get("drafter") or "draft-model",
        draft_model=draft if is_draft_model and draft and draft != DEFAULT_DRAFT else None,
        rule=values.get("rule") or "static", gamma=_int(values, "gamma", 4), max_draft=_int(values, "max_draft", 8),
        lam=_float(values, "lam", None), ngram=_int(values, "ngram", 3), skip_layers=skip,
        max_new_tokens=_int(values, "max_new_tokens", 64), temperature=_float(values, "temperature", 0.0),
        top_k=_int(values, "top_k", 0), top_p=_float(values, "top_p", 1.0), seed=_int(values, "seed", 0),
        dtype=values.get("dtype") or "auto", chat=bool(values.get("chat", True)))
    return options.validate()


def _int(values: dict, key: str, default: int) -> int:
    value = values.get(key)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{key} must be a whole number, got {value!r}") from None
    if number != int(number):
        raise OptionsError(f"{key} must be a whole number, got {value!r}")
    return int(number)


def _float(values: dict, key: str, default):
    value = values.get(key)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{key} must be a number, got {value!r}") from None


# ---- models -------------------------------------------------------------------------------------------------

def _models_module():
    try:
        from decoders import models
    except ImportError as err:  # the registry module is missing from this checkout
        raise RuntimeError(f"the model registry (decoders/models.py) is not available: {err}") from None
    return models


def model_error_types() -> tuple[type[BaseException], ...]:
    try:
        return (_models_module().ModelError,)
    except RuntimeError:
        return ()


def draft_name(options: DecodeOptions) -> str | None:
    """The draft model this run needs (None when it needs none); no pairing raises OptionsError."""
    return draft_for(options)


def load(name: str, options: DecodeOptions, report: Callable[[float, str], None] | None = None):
    """decoders.models.load_model with its progress callback forwarded to `report(fraction, message)`."""
    def progress(*args, **kwargs):
        fraction = next((a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)), None)
        message = next((a for a in args if isinstance(a, str)), kwargs.get("message", ""))
        if report is not None:
            report(fraction, f"{name}: {message}" if message else f"loading {name}")  # fraction None: spinner

    return _models_module().load_model(name, dtype=options.dtype, device=options.device, progress=progress)


def load_models(options: DecodeOptions, report=None) -> tuple[object, object | None]:
    target = load(options.model, options, report)
    name = draft_name(options)
    draft = load(name, options, report) if name else None
    return target, draft


# ---- the decode generator (the only GPU function) -------------------------------------------------------------

@gpu(duration=120)
def decode_rounds(options: dict, prompt: str, every: float) -> Iterator[dict]:
    """Stream a run as plain trace dicts: at most one per `every` seconds, and always the finished trace.

    Plain data in and out, so it can run in ZeroGPU's forked worker. Closing this generator (Stop) closes the
    core's generator, whose `finally` frees every cache.
    """
    from decoders.api import stream

    opts = DecodeOptions(**{**options, "skip_layers": tuple(options["skip_layers"])
                            if options.get("skip_layers") is not None else None})
    target, draft = load_models(opts)
    with DECODE_LOCK:
        rounds = stream(opts, prompt, target=target, draft=draft)
        try:
            last = time.monotonic()
            trace = None
            for trace in rounds:
                now = time.monotonic()
                if every >= 0 and now - last >= every:
                    yield trace.to_dict()
                    last = time.monotonic()
        finally:
            rounds.close()
        if trace is not None:
            yield trace.to_dict()


def run(*values, progress=gr.Progress(), session: str | None = None) -> Iterator[dict]:
    """The Run button: validate, load (with progress), then stream rendered rounds until done or stopped."""
    stop_flag, closed = threading.Event(), threading.Event()
    if session:
        _STOPS[session], _CLOSED[session] = stop_flag, closed
        _LATEST.pop(session, None)
    try:
        yield from _run(dict(zip(RUN_INPUTS, values)), progress, session, stop_flag)
    finally:  # also when Gradio closes this generator (Stop's cancels=[...]): the decoder is closed with it
        closed.set()


def _run(controls: dict, progress, session: str | None, stop_flag: threading.Event) -> Iterator[dict]:
    try:
        options = options_from(controls)
        prompt = str(controls.get("prompt") or "")
        if not prompt.strip():
            raise OptionsError("the prompt is empty; type something for the model to continue, or pick an example")
        yield {"status": f"Loading {options.model}…", "error": ""}
        started = time.monotonic()
        load_models(options, lambda f, m: progress(f, desc=m))
        loaded = time.monotonic() - started
        yield {"status": f"Decoding with {options.model} ({'loaded' if loaded > 1 else 'cached'})…"}
        live = bool(controls.get("live", True))
        rounds = decode_rounds(options.to_dict(), prompt, STREAM_EVERY if live else STOP_POLL)
        try:
            for data in rounds:
                trace = Trace.from_dict(data)
                if stop_flag.is_set() and not trace.stop_reason:
                    rounds.close()  # the core's finally frees every cache
                    _mark_stopped(trace)
                if session:
                    _LATEST[session] = trace
                if live or trace.stop_reason:
                    yield _views(trace)
                if trace.stop_reason:
                    break
        finally:
            rounds.close()
    except OptionsError as err:
        yield _error(str(err))
    except (TraceError, RuntimeError, ValueError, OSError, *model_error_types()) as err:
        yield _error(f"{type(err).__name__}: {err}")
    except Exception as err:  # never a traceback in the page; the server log keeps the details
        yield _error(f"Unexpected error ({type(err).__name__}): {err}")


def _views(trace: Trace) -> dict:
    views = full_views(trace, status=_status(trace), with_stats_plot=bool(trace.stop_reason))
    if trace.stop_reason:
        views["download"] = write_trace_file(trace)
    return views


def _mark_stopped(trace: Trace) -> None:
    from decoders.stats import summarize

    trace.stop_reason = "cancelled"
    trace.totals = summarize(trace)


def _status(trace: Trace) -> str:
    rounds = len(trace.rounds)
    if trace.stop_reason == "cancelled":
        return f"Stopped: {len(trace.output_ids)} tokens in {rounds} rounds; the decoder closed and freed its caches."
    done = {"eos": "finished at end-of-sequence", "max_new_tokens": "finished (max new tokens)",
            "context": "stopped at the context limit"}.get(trace.stop_reason)
    return f"{'Done' if done else 'Decoding'}: {len(trace.output_ids)} tokens in {rounds} rounds" + \
        (f" · {done}" if done else "…")


def _error(message: str) -> dict:
    gr.Warning(message)
    return {"status": "Not run: see the message.", "error": error_html(message)}


def stop(trace: Trace | None, session: str | None = None) -> dict:
    """Stop: flag this session's run, wait for it to close, and show the partial trace (downloadable)."""
    flag, closed = _STOPS.get(session or ""), _CLOSED.get(session or "")
    if flag is not None and closed is not None:
        flag.set()
        closed.wait(STOP_WAIT)  # one round at most; Gradio's cancels=[...] may also have closed it already
        trace = _LATEST.get(session, trace)  # gr.State may still hold the trace from before this run
    if not isinstance(trace, Trace):
        return {"status": "Stopped."}
    if trace.stop_reason and trace.stop_reason != "cancelled":
        return {"status": "Nothing to stop: the last run had already finished."}
    if not trace.stop_reason:
        _mark_stopped(trace)
    return _views(trace)


# ---- scrubbing and trace files ------------------------------------------------------------------------------

def show_round(trace: Trace | None, value) -> dict:
    """The round slider (1-based) re-renders that round from the trace in gr.State."""
    if not isinstance(trace, Trace) or not trace.rounds:
        return {}
    return round_views(trace, int(value or 1) - 1)


def select_token(trace: Trace | None, evt: gr.SelectData) -> dict:
    """Clicking a token jumps to the round that committed it."""
    if not isinstance(trace, Trace):
        return {}
    index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    rnd = round_of_span(trace, index)
    if rnd is None:
        return {}
    return {**round_views(trace, rnd), "slider": slider_update(len(trace.rounds), rnd)}


def load_trace(path: str | None, origin: str = "uploaded") -> dict:
    """Replay a trace file without any model; a bad file gives a visible error and changes nothing else."""
    if not path:
        return {}
    try:
        trace = read_trace_file(path)
        views = full_views(trace, status=f"Replaying a {origin} trace ({trace.label}); no model needed.")
    except TraceError as err:
        return _error(f"Could not load the trace: {err}")
    except Exception as err:  # a file that validates but cannot be drawn (wrong value types)
        return _error(f"Could not load the trace: it does not match the trace format ({type(err).__name__}: {err})")
    views["download"] = str(path)
    return views
