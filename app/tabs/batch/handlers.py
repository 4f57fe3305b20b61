"""The Batch tab's handlers (plain dicts out, so tests call them without a browser).

Run: validate, load inside the decode slot (app.shared.loading.loaded), then stream the batch round by round; Stop
closes the decoder at the next round (its `finally` frees every cache). A lane click or the round slider redraws
one row's rounds in the views the Generate tab uses (app/figures), from the batch held in the page's state.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import gradio as gr

from decoders.batch import MAX_BATCH, BatchTrace, batched_drafters
from decoders.options import DecodeOptions, OptionsError
from decoders.trace import TraceError

from app.shared.boxes import refuse_out_of_range
from app.figures.batch import batch_stats_html, lanes_html, throughput_figure, why_sentences
from app.figures.rule import rounds_figure
from app.figures.stats import stats_html
from app.figures.text import legend_html, provenance_spans
from app.figures.tree import tree_figure
from app.shared import loading
from app.shared.decode_slot import DECODE_SLOT
from app.shared.hosting import check_model_allowed, gpu
from app.shared.session import RunSession
from app.shared.words import counted
from app.tabs.generate.views import interesting_round

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
OUTPUTS = ("status", "error", "lanes", "stats", "row_title", "row_text", "legend", "row_stats", "tree", "rounds",
           "slider", "state", "row")
ROW_OUTPUTS = ("lanes", "row_title", "row_text", "legend", "row_stats", "tree", "rounds", "slider", "row")
STREAM_EVERY = 0.25  # s between two drawn rounds while a batch streams (the last one is always drawn)
METHODS = {"batched speculative": "speculative", "batched baseline": "baseline"}
EXAMPLE_PROMPTS = "\n".join([
    "Write a Python function that reverses a string.",
    "Repeat after me, exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the "
    "lazy dog.",
    "What is the capital of France?",
    "List the first ten prime numbers, separated by commas.",
])


def parse_prompts(text: str) -> list[str]:
    prompts = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not prompts:
        raise OptionsError("type at least one prompt: one per line, each line is one row of the batch")
    if len(prompts) > MAX_BATCH:
        raise OptionsError(f"{len(prompts)} prompts: a batch takes at most {MAX_BATCH} rows; remove "
                           f"{counted(len(prompts) - MAX_BATCH, 'line')}")
    return prompts


def parse_seeds(text: str, n: int) -> list[int] | None:
    words = (text or "").replace(",", " ").split()
    if not words:
        return None
    try:
        seeds = [int(w) for w in words]
    except ValueError:
        raise OptionsError(f"seeds must be whole numbers separated by commas or spaces, got {text!r}") from None
    if len(seeds) == 1:
        return seeds * n
    if len(seeds) != n:
        raise OptionsError(f"{len(seeds)} seeds for {counted(n, 'prompt')}: give one seed, or one per prompt")
    return seeds


def options_for(model: str, method: str, drafter: str, max_tokens, temperature) -> DecodeOptions:
    refuse_out_of_range((max_tokens, temperature))
    if method not in METHODS:
        raise OptionsError(f"method must be one of: {', '.join(METHODS)}")
    if drafter not in batched_drafters():
        raise OptionsError(f"drafter must be one of: {', '.join(batched_drafters())}")
    try:
        max_new, temp = int(max_tokens), float(temperature)
    except (TypeError, ValueError):
        raise OptionsError("max tokens must be a whole number and temperature a number") from None
    return DecodeOptions(model=(model or "").strip(), method=METHODS[method], drafter=drafter,
                         max_new_tokens=max_new, temperature=temp).validate()


def run_batch(prompts_text: str, model: str, method: str, drafter: str, max_tokens, temperature, seeds_text: str,
              session: RunSession | None = None, progress=None) -> Iterator[dict]:
    """The Run button: validate, load, stream the batch until every row is done or Stop is pressed."""
    session = session if session is not None else RunSession()
    try:
        prompts = parse_prompts(prompts_text)
        options = options_for(model, method, drafter, max_tokens, temperature)
        seeds = parse_seeds(seeds_text, len(prompts))
        check_model_allowed(options.model)
    except OptionsError as err:
        yield _error(str(err))
        return
    if not session.begin():
        yield {**_skip(), "status": "Cancelled: Stop was pressed while this run waited; nothing ran."}
        return
    batch = None
    try:
        loading.check_before_waiting(prompts, options)  # seconds: a model that cannot load here, a prompt over the cap
        yield {**_skip(), "status": f"Loading {options.model} (after any run in another tab)…", "error": ""}
        report = (lambda fraction, message: progress(fraction, desc=message)) if progress else None
        with DECODE_SLOT.queue(SLOT_NAME) as turn:
            for line in turn.lines(stop=session.stop_requested.is_set):
                yield {**_skip(), "status": line}
            if turn.cancelled:
                yield {**_skip(), "status": NOT_STARTED}
                return
            with loading.loaded(options, report=report, turn=turn, stop=session.stop_requested.is_set):
                rounds = decode_batch(options.to_dict(), prompts, seeds)
                try:
                    for data in rounds:
                        if "waiting" in data:  # another run took the slot between the load and the decode
                            if session.stop_requested.is_set():
                                break
                            yield {**_skip(), "status": data["waiting"]}
                            continue
                        batch = BatchTrace.from_dict(data)
                        if session.stop_requested.is_set():
                            break
                        yield views(batch)
                finally:
                    rounds.close()  # the decoder's finally frees every cache
    except (OptionsError, TraceError, RuntimeError, ValueError, *loading.model_error_types()) as err:
        yield _error(str(err))
        return
    except Exception as err:  # never a traceback in the page
        yield _error(f"Unexpected error ({type(err).__name__}): {err}")
        return
    finally:
        session.end()
    if batch is not None and session.stop_requested.is_set():
        yield {**views(batch), "status": "Stopped: the decoder closed and freed its caches. " + status_line(batch)}


SLOT_NAME = "a Batch run"  # what a batch is called to the runs waiting behind it (app/shared/decode_slot.py)
NOT_STARTED = "Stopped before your batch started: it was waiting for its turn; nothing ran."


def stop(session: RunSession | None) -> str:
    """The Stop button: the running batch ends at its next round; say so, or that nothing runs."""
    if session is None or not (session.running or session.queued):
        return "Nothing to stop: no batch is running in this tab."
    session.request_stop()
    return "Stopping at the next round …"


@gpu(duration=120)
def decode_batch(options: dict, prompts: list[str], seeds: list[int] | None) -> Iterator[dict]:
    """Plain batch-trace dicts: at most one per STREAM_EVERY seconds, and always the last; before them,
    {"waiting": line} while another run holds the decode slot. The models load inside the slot."""
    from decoders.api import stream_batch

    opts = DecodeOptions.from_dict(options)
    batch, last = None, 0.0
    with DECODE_SLOT.queue(SLOT_NAME) as turn:
        for line in turn.lines():
            yield {"waiting": line}
        decoder = loading.loaded_run(opts, lambda target, draft: stream_batch(opts, prompts, seeds, target=target,
                                                                              draft=draft))
        with DECODE_SLOT.hold(decoder, turn=turn) as lease:
            for batch in lease.items():
                done = all(row.stop_reason for row in batch)
                if done or time.monotonic() - last >= STREAM_EVERY:
                    yield batch.to_dict()
                    last = time.monotonic()
    if batch is not None:
        yield batch.to_dict()


def status_line(batch: BatchTrace) -> str:
    done = sum(1 for row in batch if row.stop_reason)
    t = batch.totals or batch.summarize()
    rate = t.get("tokens_per_second")
    return (f"{counted(len(batch), 'row')}, {done} finished · {counted(t['tokens'], 'token')} in "
            f"{counted(len(batch.rounds), 'batched round')} · "
            f"{'–' if rate is None else f'{rate:.1f}'} tokens/s in total · {batch.label}")


def views(batch: BatchTrace, row: int = 0, index: int | None = None) -> dict:
    out = {"status": status_line(batch), "error": "", "stats": batch_stats_html(batch), "state": batch.to_dict()}
    return {**out, **row_views(batch, row, index)}


def row_views(batch: BatchTrace, row: int, index: int | None = None) -> dict:
    """One row's rounds in the Generate tab's views (its own Trace), and the lanes with that row outlined."""
    row = max(0, min(int(row), len(batch) - 1))
    trace = batch[row]
    n = len(trace.rounds)
    if index is None:  # a finished row opens on a round worth looking at (the Generate tab's choice)
        index = interesting_round(trace) if trace.stop_reason else n - 1
    index = max(0, min(int(index), n - 1))
    return {"lanes": lanes_html(batch, row), "row": row,
            "row_title": f"**Row {row + 1}**: “{_short(trace.prompt)}” · "
                         f"{counted(len(trace.output_ids), 'token')} in {counted(n, 'round')} · "
                         f"stop: {trace.stop_reason or 'decoding'}",
            # the legend without a round outline: legend_html's outline CSS targets the Generate tab's text
            "row_text": provenance_spans(trace), "legend": legend_html(),
            "row_stats": stats_html(trace),
            "tree": tree_figure(trace, index if n else None), "rounds": rounds_figure(trace, index if n else None),
            "slider": gr.update(minimum=1, maximum=max(n, 2), value=index + 1, step=1, interactive=n > 1)}


def open_row(state: dict | None, row) -> dict:
    """A lane click: that row's last round."""
    if not state:
        return {name: gr.skip() for name in ROW_OUTPUTS}
    return row_views(BatchTrace.from_dict(state), int(row or 0))


def show_round(state: dict | None, row, value) -> dict:
    if not state:
        return {name: gr.skip() for name in ROW_OUTPUTS}
    return row_views(BatchTrace.from_dict(state), int(row or 0), int(value or 1) - 1)


def _short(text: str, n: int = 60) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _skip() -> dict:
    return {name: gr.skip() for name in OUTPUTS}


def _error(message: str) -> dict:
    import html

    return {**_skip(), "status": "Not run: see the message.",
            "error": f'<div class="sl-error" id="bt-error-msg">⚠ {html.escape(message)}</div>'}


# --- throughput: recorded (bench/results) or measured here ---

def recorded_throughput(target: str, prompt_set: str = "code-editing") -> tuple[list[dict], list[dict], str]:
    """(rows, t(n·B) grid, where from) from bench/results/batch-<target>.json; empty when not recorded."""
    path = RESULTS / f"batch-{target}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], [], f"no recorded run for {target} (python -m bench.batch --target {target} writes one)"
    rows = [r for r in data.get("rows", []) if r.get("set") == prompt_set and r.get("tokens_per_second")]
    s = data.get("settings", {})
    return rows, data.get("t_grid") or [], (f"recorded: {path.name}, {prompt_set} prompts, {s.get('max_new_tokens')} "
                                            f"new tokens per row, {s.get('threads')} threads, {s.get('machine')}")


def throughput_views(rows: list[dict], grid: list[dict], source: str) -> dict:
    sentences = why_sentences(rows, grid)
    body = "".join(f"<li>{line}</li>" for line in sentences)
    return {"throughput": throughput_figure(rows, f"Total tokens/s against B · {source.split(',')[0]}"),
            "why": f'<p class="sl-note" title="where these figures come from">{source}</p><ul>{body}</ul>'}


def measure_here(prompts_text: str, model: str, drafter: str, max_tokens, session: RunSession | None = None
                 ) -> Iterator[dict]:
    """Time the batched baseline and batched speculative decoding at B = 1, 2, 4 on these prompts, here, now."""
    session = session if session is not None else RunSession()
    try:
        prompts = parse_prompts(prompts_text)
        options = options_for(model, "batched speculative", drafter, max_tokens, 0.0)
        check_model_allowed(options.model)
    except OptionsError as err:
        yield {"throughput": gr.skip(), "why": _error(str(err))["error"]}
        return
    if not session.begin():
        yield {"throughput": gr.skip(), "why": "Cancelled: Stop was pressed while this waited."}
        return
    rows: list[dict] = []
    try:
        loading.check_before_waiting(prompts, options)
        yield {"throughput": gr.skip(), "why": "Measuring B = 1, 2, 4 (batched baseline and batched speculative), "
                                               "after any run in another tab…"}
        with loading.loaded(options):
            for data in measure_rows(options.to_dict(), prompts):
                if session.stop_requested.is_set():
                    break
                rows.append(data)
                yield throughput_views(rows, [], "measured here just now (greedy, the prompts above, cycled to B)")
    except (OptionsError, RuntimeError, ValueError, *loading.model_error_types()) as err:
        yield {"throughput": gr.skip(), "why": _error(str(err))["error"]}
    finally:
        session.end()


@gpu(duration=120)
def measure_rows(options: dict, prompts: list[str], batches=(1, 2, 4)) -> Iterator[dict]:
    from dataclasses import replace

    from decoders.api import generate_batch

    opts = replace(DecodeOptions.from_dict(options), temperature=0.0, record=False)
    with DECODE_SLOT.hold(what="a Batch throughput measurement (loading)"):  # a load is PyTorch work too
        target, draft = loading.load_models(opts)
    for b in batches:
        rows = [prompts[i % len(prompts)] for i in range(b)]
        for key, method in (("baseline", "baseline"), (opts.drafter, "speculative")):
            run = replace(opts, method=method)
            with DECODE_SLOT.hold(what="a Batch throughput measurement"):
                batch = generate_batch(run, rows, target=target, draft=draft if method != "baseline" else None)
            yield {"batch": b, "method": key, "tokens_per_second": batch.totals["tokens_per_second"],
                   "tau": batch.totals["tau"]}
