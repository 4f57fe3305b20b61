"""The Race tab's handler: the same prompt through the baseline and up to three methods, one after another.

Each method first runs a short warm-up (allocations, first-call overheads, lazy loads), then the timed run with
recording off (counters and timings only, identical tokens), so the numbers measure decoding, not the UI.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator

import gradio as gr

from decoders.options import DecodeOptions, OptionsError
from decoders.trace import Trace

from .handlers import DEFAULT_DRAFT, gpu, load_models, model_error_types
from .render_race import leviathan_figure, race_row, race_table_html, speed_figure
from .views import error_html

RACE_OUTPUTS = ("race_status", "race_error", "race_table", "race_speed", "race_curve")
RACE_INPUTS = ("prompt", "model", "dtype", "draft_model", "methods", "max_new_tokens", "temperature", "seed")
MAX_METHODS = 3
WARMUP_TOKENS = 8
PRESETS = {
    "prompt lookup · static γ=4": dict(drafter="prompt-lookup", rule="static", gamma=4),
    "prompt lookup · heuristic": dict(drafter="prompt-lookup", rule="heuristic", gamma=4),
    "draft model · static γ=4": dict(drafter="draft-model", rule="static", gamma=4),
    "draft model · AdaEDL": dict(drafter="draft-model", rule="adaedl", max_draft=8),
    "draft model · max-confidence": dict(drafter="draft-model", rule="max-confidence", max_draft=8),
    "layer skip · static γ=3": dict(drafter="layer-skip", rule="static", gamma=3),
    "layer skip · AdaEDL": dict(drafter="layer-skip", rule="adaedl", max_draft=6),
}
DEFAULT_METHODS = ["prompt lookup · static γ=4", "layer skip · AdaEDL"]


def race_options(values: dict) -> list[DecodeOptions]:
    """Baseline first, then each chosen preset; validated (raises OptionsError)."""
    methods = list(values.get("methods") or [])
    if not methods:
        raise OptionsError("pick at least one method to race against the baseline")
    if len(methods) > MAX_METHODS:
        raise OptionsError(f"pick at most {MAX_METHODS} methods (got {len(methods)}); each one costs a full run")
    unknown = [m for m in methods if m not in PRESETS]
    if unknown:
        raise OptionsError(f"unknown race method(s) {unknown}; choose from: {', '.join(PRESETS)}")
    draft = values.get("draft_model")
    try:
        base = DecodeOptions(model=str(values.get("model") or DecodeOptions.model), dtype=values.get("dtype") or "auto",
                             max_new_tokens=_whole(values.get("max_new_tokens"), 64),
                             temperature=float(values.get("temperature") or 0.0),
                             seed=_whole(values.get("seed"), 0), record=False)
    except (TypeError, ValueError) as err:
        raise OptionsError(f"race settings: {err}") from None
    runs = [base.validate()]
    for name in methods:
        preset = dict(PRESETS[name])
        if preset["drafter"] == "draft-model" and draft and draft != DEFAULT_DRAFT:
            preset["draft_model"] = draft
        runs.append(replace(base, method="speculative", **preset).validate())
    return runs


def _whole(value, default: int) -> int:
    if value is None or value == "":
        return default
    if float(value) != int(float(value)):
        raise ValueError(f"expected a whole number, got {value!r}")
    return int(float(value))


@gpu(duration=240)
def race_runs(options: list[dict], prompt: str) -> Iterator[dict]:
    """Warm up and time each run in turn; yields each finished trace as a plain dict."""
    from decoders.api import generate

    from .handlers import DECODE_LOCK

    for data in options:
        opts = DecodeOptions(**{**data, "skip_layers": None})
        target, draft = load_models(opts)
        with DECODE_LOCK:
            generate(replace(opts, max_new_tokens=min(WARMUP_TOKENS, opts.max_new_tokens)), prompt, target, draft)
            trace = generate(opts, prompt, target, draft)
        yield trace.to_dict()


def race(*values, progress=gr.Progress()) -> Iterator[dict]:
    controls = dict(zip(RACE_INPUTS, values))
    try:
        prompt = str(controls.get("prompt") or "")
        if not prompt.strip():
            raise OptionsError("the prompt is empty; type something for the model to continue, or pick an example")
        runs = race_options(controls)
        yield {"race_status": "Loading models…", "race_error": ""}
        for opts in runs:
            load_models(opts, lambda f, m: progress(f, desc=m))
        traces: list[Trace] = []
        started = time.monotonic()
        yield {"race_status": f"Racing 1/{len(runs)}: baseline (with a warm-up)…"}
        for i, data in enumerate(race_runs([o.to_dict() for o in runs], prompt)):
            traces.append(Trace.from_dict(data))
            rows = [race_row(t, traces[0]) for t in traces]
            done = len(traces) == len(runs)
            status = f"Done in {time.monotonic() - started:.1f} s." if done else \
                f"Racing {len(traces) + 1}/{len(runs)}: {_label(runs[len(traces)])} (with a warm-up)…"
            yield {"race_status": status, "race_table": race_table_html(rows), "race_speed": speed_figure(rows),
                   "race_curve": leviathan_figure(rows)}
    except OptionsError as err:
        yield _race_error(str(err))
    except (RuntimeError, ValueError, OSError, *model_error_types()) as err:
        yield _race_error(f"{type(err).__name__}: {err}")
    except Exception as err:  # never a traceback in the page
        yield _race_error(f"Unexpected error ({type(err).__name__}): {err}")


def _label(options: DecodeOptions) -> str:
    from decoders import label

    return label(options)


def _race_error(message: str) -> dict:
    gr.Warning(message)
    return {"race_status": "Not run: see the message.", "race_error": error_html(message)}
