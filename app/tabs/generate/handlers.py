"""Event handlers for the Generate tab: UI values -> DecodeOptions -> the core's rounds -> rendered views.

Handlers return dicts keyed by the names in views.OUTPUTS; layout.py turns them into tuples for Gradio. Models are
the only process-wide objects (decoders.runtime.models caches them); a user's trace and run bookkeeping live in gr.State.
"""
from __future__ import annotations

import html
import time
from typing import Callable, Iterator

import gradio as gr

from decoders.options import DecodeOptions, OptionsError, fields_in_use
from decoders.trace import Trace, TraceError

from app.tabs.generate.controls import DEFAULT_DRAFT, FROM_HEAD, opening_differences
from app.shared.boxes import refuse_out_of_range
from app.shared.decode_slot import DECODE_SLOT
from app.shared.errors import log_handled
from app.shared.hosting import check_model_allowed, gpu
from app.shared.numbers import whole_field
from app.shared.loading import LoadCancelled, check_before_waiting, dtype_line, loaded, loaded_run, model_error_types
from app.figures.text import round_of_span
from app.shared.session import EarlierOutputs, RunSession
from app.shared.theme import stop_words
from app.shared.words import counted
from app.tabs.generate.views import error_html, full_views, read_trace_file, round_views, slider_update, write_trace_file


# The controls of the Generate tab, in the order layout.py passes them.
RUN_INPUTS = ("prompt", "model", "dtype", "method", "drafter", "draft_model", "rule", "controller", "gamma", "max_draft",
              "lam",
              "ngram", "skip_layers", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "chat", "live",
              "eagle_head", "tree_k", "tree_depth", "tree_m", "ddd_checks", "ddd_x", "ddd_steps", "ddd_width",
              "suffix_depth", "suffix_tokens", "suffix_factor", "suffix_min_prob")
STREAM_EVERY = 0.4  # seconds between streamed updates: each one costs drawing time (server and browser)
STOP_WAIT = 15.0  # seconds Stop waits for Gradio to close the run (it closes between rounds, or after a load)
STOP_POLL = 1.0  # with live drawing off, the run still hands Gradio a (no-op) update this often so Stop can close it
D = DecodeOptions()


def options_from(values: dict) -> DecodeOptions:
    """Map control values one-to-one onto DecodeOptions and validate (raises OptionsError). Controls that do not
    apply to the chosen method (options.fields_in_use) are ignored, so a hidden control cannot break a run; a box
    holding a number outside its slider's range is refused (app/shared/boxes.py), hidden or not."""
    refuse_out_of_range(values.values())
    method = values.get("method") or D.method
    drafter = values.get("drafter") or D.drafter
    rule = values.get("rule") or D.rule
    temperature = _float(values, "temperature", D.temperature)
    used = fields_in_use(method, drafter, rule, temperature, values.get("controller") or D.controller)
    # Fields without a control (record, device, lam_keep) keep their defaults.
    fields = {name: _PARSERS[name](values, name) for name in used if name in _PARSERS}
    if fields.get("eagle_head") is not None:  # the tree grows from the head, so the draft-model choice is moot
        fields.pop("draft_model", None)
    options = DecodeOptions(**fields).validate()
    check_model_allowed(options.model, "target model")
    check_model_allowed(options.draft_model, "draft model")
    return options


def _draft_model(values: dict) -> str | None:
    draft = str(values.get("draft_model") or "").strip()
    return None if not draft or draft == DEFAULT_DRAFT else draft


def _skip_layers(values: dict) -> tuple[int, ...] | None:
    text = str(values.get("skip_layers") or "").strip()
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise OptionsError(f"layers to skip must be comma-separated whole numbers like 9,11,13; got {text!r}") \
            from None


def _ddd_checks(values: dict) -> tuple[int, ...]:
    text = str(values.get("ddd_checks") or "").strip()
    if not text:
        return D.ddd_checks
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise OptionsError(f"DDD's check steps must be comma-separated whole numbers like 5,7,9 (the paper's); "
                           f"got {text!r}") from None


def _eagle_head(values: dict) -> str | None:
    """The tree-source control: FROM_HEAD = the target's own head ("auto"); anything else = the draft model."""
    return "auto" if values.get("eagle_head") == FROM_HEAD else None


def _int(values: dict, key: str, default: int) -> int:
    """A whole-number control: absent (an API call without it) is its default; empty, fractional or not a number is
    refused (app/shared/numbers.py)."""
    return whole_field(values, key, LABELS.get(key, key), default)


# The boxes' labels, for messages about what was typed into them.
LABELS = {"max_new_tokens": "max new tokens", "seed": "seed", "gamma": "γ", "max_draft": "max draft (L_max)",
          "ngram": "n-gram", "top_k": "top-k", "tree_k": "K", "tree_depth": "D", "tree_m": "M",
          "ddd_steps": "DDD steps", "ddd_width": "DDD width"}


def _float(values: dict, key: str, default):
    value = values.get(key)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{key} must be a number, got {value!r}") from None


# Control value -> DecodeOptions field; an empty control means the field's default.
_PARSERS = {
    "model": lambda values, key: str(values.get(key) or D.model).strip(),
    "method": lambda values, key: values.get(key) or D.method,
    "drafter": lambda values, key: values.get(key) or D.drafter,
    "rule": lambda values, key: values.get(key) or D.rule,
    "controller": lambda values, key: values.get(key) or D.controller,
    "dtype": lambda values, key: values.get(key) or D.dtype,
    "chat": lambda values, key: bool(values.get(key, D.chat)),
    "draft_model": lambda values, key: _draft_model(values),
    "skip_layers": lambda values, key: _skip_layers(values),
    "ddd_checks": lambda values, key: _ddd_checks(values),
    "eagle_head": lambda values, key: _eagle_head(values),
    **{key: lambda values, key: _int(values, key, getattr(D, key))
       for key in ("gamma", "max_draft", "ngram", "max_new_tokens", "top_k", "seed", "tree_k", "tree_depth", "tree_m",
                   "ddd_steps", "ddd_width", "suffix_depth", "suffix_tokens")},
    **{key: lambda values, key: _float(values, key, getattr(D, key)) for key in ("lam", "temperature", "top_p",
                                                                               "ddd_x", "suffix_factor",
                                                                               "suffix_min_prob")},
}


# ---- the decode generator (the only GPU function) -------------------------------------------------------------

@gpu(duration=120)
def decode_rounds(options: dict, prompt: str, every: float, store: dict | None = None) -> Iterator[dict]:
    """Stream a run as plain trace dicts: at most one per `every` seconds, and always the finished trace; before it,
    {"waiting": line} while another run holds the decode slot.

    Plain data in and out, so it can run in ZeroGPU's forked worker (store: the visitor's earlier outputs,
    SuffixStore.to_dict, for suffix decoding). The models load inside the slot (cache hits: `loaded` loaded them).
    Closing this generator (Stop) closes the core's generator, whose `finally` frees every cache; so does a later run
    taking over an abandoned one.
    """
    from decoders import SuffixStore
    from decoders.api import stream

    opts = DecodeOptions.from_dict(options)
    with DECODE_SLOT.queue(slot_name(opts)) as turn:
        for line in turn.lines():
            yield {"waiting": line}
        earlier = SuffixStore.from_dict(store) if store is not None else None
        decoder = loaded_run(opts, lambda target, draft: stream(opts, prompt, target=target, draft=draft,
                                                                store=earlier))
        trace = None
        with DECODE_SLOT.hold(decoder, turn=turn) as lease:
            last = time.monotonic()
            for trace in lease.items():
                now = time.monotonic()
                if every >= 0 and now - last >= every:
                    yield trace.to_dict()
                    last = time.monotonic()
    if trace is not None:
        yield trace.to_dict()


def slot_name(options: DecodeOptions) -> str:
    """What a Generate run is called to the runs waiting behind it (app/shared/decode_slot.py)."""
    return f"a Generate run ({options.model})"


def admit(session: RunSession | None) -> None:
    """Gradio accepted a Run into its queue (layout.py calls this from the event's validator, before any wait)."""
    if session is not None:
        session.admit()


def run(*values, progress=gr.Progress(), session: RunSession | None = None) -> Iterator[dict]:
    """The Run button: validate, load (with progress), then stream rendered rounds until done or cancelled.

    Stop (app/shared/session.py) ends this generator between two rounds; closing it closes the decoder, whose `finally`
    frees the caches. The session records the rounds for Stop to show."""
    session = session if session is not None else RunSession()
    if not session.begin():
        yield {"status": "Cancelled: Stop was pressed while this run waited in the queue; nothing ran.",
               "error": ""}
        return
    rounds = _run(dict(zip(RUN_INPUTS, values)), progress, session)
    try:
        yield from rounds
    finally:
        rounds.close()
        session.end()


def _run(controls: dict, progress, session: RunSession) -> Iterator[dict]:
    try:
        options = options_from(controls)
        prompt = str(controls.get("prompt") or "")
        if not prompt.strip():
            raise OptionsError("the prompt is empty; type something for the model to continue, or pick an example")
        check_before_waiting(prompt, options)  # seconds: a model that cannot load here, a prompt over the cap
        yield {"status": f"Loading {options.model} (after any run in another tab)…", "error": ""}
        with DECODE_SLOT.queue(slot_name(options)) as turn:
            for line in turn.lines(stop=session.stop_requested.is_set):
                yield {"status": line}
            if turn.cancelled:
                yield {"status": NOT_STARTED}
                return
            with loaded(options, report=lambda fraction, message: progress(fraction, desc=message),
                        turn=turn, stop=session.stop_requested.is_set) as [(target, _)]:
                n_prompt = len(target.encode_prompt(prompt, chat=options.chat))
                yield {"status": f"Processing the prompt ({counted(n_prompt, 'token')}) with {options.model} "
                                 f"({_dtype_of(target)})… the first round follows."}
                live = bool(controls.get("live", True))
                yield from _decode(options, prompt, live, session, progress)
    except OptionsError as err:
        yield _error(str(err))
    except LoadCancelled as err:
        yield {"status": str(err), "error": ""}
    except (TraceError, RuntimeError, ValueError, OSError, *model_error_types()) as err:
        yield _error(f"{type(err).__name__}: {err}", err)
    except Exception as err:  # never a traceback in the page; the server log keeps the details (_error)
        yield _error(f"Unexpected error ({type(err).__name__}): {err}", err, unexpected=True)


NOT_STARTED = "Stopped before your run started: it was waiting for its turn; nothing ran."


def _decode(options: DecodeOptions, prompt: str, live: bool, session: RunSession,
            progress: Callable = lambda *a, **k: None) -> Iterator[dict]:
    """Rendered rounds while live; otherwise a no-op update every STOP_POLL s, so Gradio can close the run. Before
    the first round: what the run waits for, then how far the prompt has been read. The progress bar over the result
    counts the tokens (it said "ready 100 %" from the load for the whole decode, issue 47.5)."""
    copies = "suffix_depth" in options.fields_in_use()  # suffix decoding reads the visitor's earlier outputs
    store = session.earlier.store(options.model).to_dict() if copies else None
    rounds = decode_rounds(options.to_dict(), prompt, STREAM_EVERY if live else STOP_POLL, store)
    remembered = False  # the finished trace can arrive twice (the last streamed round, then the final word)
    try:
        for data in rounds:
            if "waiting" in data:  # another run took the slot between the load and the decode
                if session.stop_requested.is_set():
                    yield {"status": NOT_STARTED}
                    return
                yield {"status": data["waiting"]}
                continue
            trace = Trace.from_dict(data)
            session.latest = trace
            if session.stop_requested.is_set():
                rounds.close()  # caches freed before the page says so
                _mark_stopped(trace)
                yield _views(trace)  # the run's own last word: right even when Stop gave up waiting for it
                return
            if trace.prefill and not trace.stop_reason:
                progress(trace.prefill["read"] / prompt_length(trace.prefill), desc=_reading_line(trace))
                yield {"status": _reading_line(trace)}
                continue
            made = len(trace.output_ids)
            progress(min(made / options.max_new_tokens, 1.0),
                     desc=f"decoding with {options.model}: {made} of {counted(options.max_new_tokens, 'new token')}")
            if trace.stop_reason:
                if not remembered:
                    session.earlier.remember(trace)
                    remembered = True
                yield {**_views(trace), "store": store_html(session.earlier)}
                continue
            yield _views(trace) if live else {}
    finally:
        rounds.close()  # the core's finally frees every cache


def _reading_line(trace: Trace) -> str:
    """'Reading the prompt: 1,024 of 8,322 tokens (the target; Stop ends it within one chunk)…'"""
    where = trace.prefill
    who = "the target" if where["model"] == "target" else "the draft model, after the target"
    return (f"Reading the prompt: {where['read']:,} of {counted(prompt_length(where), 'token')} ({who}; Stop ends it "
            "within one chunk)…")


def prompt_length(prefill: dict) -> int:
    """The prompt's length from the decoder's reading record: it reads all but the last token before the first round
    (decoders/loop.py), so its "of" is one short of what "Processing the prompt (N tokens)" said."""
    return int(prefill["of"]) + 1


def _dtype_of(model) -> str:
    return str(getattr(model, "dtype", "?")).removeprefix("torch.")


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
    made = f"{counted(len(trace.output_ids), 'token')} in {counted(len(trace.rounds), 'round')}"
    dtype = dtype_line(trace, why=bool(trace.stop_reason))
    if trace.stop_reason == "cancelled":
        if trace.prefill:
            made = (f"while reading the prompt ({trace.prefill['read']:,} of "
                    f"{counted(prompt_length(trace.prefill), 'token')} read)")
        return f"Stopped: {made} ({dtype}); the decoder closed and freed its caches."
    done = stop_words(trace.stop_reason) if trace.stop_reason else None
    return f"{'Done' if done else 'Decoding'}: {made} ({dtype})" + \
        (f" · {done}{_versus_opening(trace)}" if done else "…")


def _versus_opening(trace: Trace) -> str:
    """Whether a finished run of the opening prompt repeated the recording the page opened on, or what differed."""
    differs = opening_differences(trace.options or {}, trace.prompt)
    if differs is None:
        return ""
    if not differs:
        return " · the same settings as the recording the page opened on"
    return " · differs from the recording the page opened on: " + ", ".join(differs)


def _error(message: str, err: BaseException | None = None, unexpected: bool = False) -> dict:
    log_handled("Generate", message, err, unexpected)  # the server log gets what the page shows
    gr.Warning(message)
    return {"status": "Not run: see the message.", "error": error_html(message)}


def stop(trace: Trace | None, session: RunSession | None = None) -> dict:
    """Stop: ask this tab's running run to end and its queued ones not to start; say what it did, show a partial run.

    The running run notices the request at its next round (or after a load), so Stop waits for it to close before
    reading what it left."""
    if session is None:  # called without a session (tests, scripts): the trace on screen is all there is
        session = RunSession()
        session.latest = trace if isinstance(trace, Trace) else None
    was_running = session.running
    queued = session.request_stop()
    if was_running and not session.idle.wait(STOP_WAIT):
        return {"status": "Stopping: the run ends at its next round (a model load cannot be interrupted) and then "
                          "shows what it produced."}
    partial = session.latest
    if partial is not None and (not partial.stop_reason or was_running and partial.stop_reason == "cancelled"):
        if not partial.stop_reason:
            _mark_stopped(partial)
        return _views(partial)
    if queued:
        return {"status": "Cancelled your queued run; nothing had started."}
    if was_running and partial is None:
        return {"status": "Stopped before the first round (your run was waiting for its turn or loading its models); "
                          "nothing was decoded."}
    if partial is None:
        return {"status": "Nothing to stop: no run has started in this tab."}
    return {"status": f"Nothing to stop: the last run had already {_ended(partial)}."}


def store_html(earlier: EarlierOutputs | None) -> str:
    """What suffix decoding's store holds for this visitor: per target model, how many outputs and tokens, and the
    start of each (newest first)."""
    stores = {model: store for model, store in (earlier.stores if earlier else {}).items() if store.outputs}
    if not stores:
        return ('<div class="sl-store">Empty: every finished run\'s output is kept here (this browser session only, '
                'at most 16 outputs per model) for suffix decoding to copy from.</div>')
    parts = []
    for model, store in stores.items():
        items = "".join(f"<li>{html.escape(text[:80]) or '(no text)'}{'…' if len(text) > 80 else ''} "
                        f"<span class='sl-muted'>({len(ids)} tokens)</span></li>"
                        for ids, text in reversed(store.outputs))
        parts.append(f"<div><b>{html.escape(model)}</b>: {len(store.outputs)} outputs, {store.tokens} tokens (of at "
                     f"most {store.max_outputs} outputs, {store.max_tokens} tokens; the oldest go first)"
                     f"<ol>{items}</ol></div>")
    return '<div class="sl-store">' + "".join(parts) + "</div>"


def clear_store(session: RunSession | None) -> str:
    """The store's Clear button: this visitor's earlier outputs are forgotten (the next suffix run starts cold)."""
    if session is not None:
        session.earlier.clear()
    return store_html(session.earlier if session is not None else None)


def _ended(trace: Trace) -> str:
    return "stopped" if trace.stop_reason == "cancelled" else "finished"


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
        views = full_views(trace, status=f"Replaying {_article(origin)} {origin} trace ({trace.label}); "
                                         "no model needed.")
    except TraceError as err:
        return _error(f"Could not load the trace: {err}", err)
    except Exception as err:  # a file that validates but cannot be drawn (wrong value types)
        return _error(f"Could not load the trace: it does not match the trace format ({type(err).__name__}: {err})",
                      err, unexpected=True)
    views["download"] = str(path)
    return views


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"
