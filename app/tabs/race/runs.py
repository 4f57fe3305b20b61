"""The Race tab's handler: the same prompt through the baseline and up to three methods, one after another.

Each method first runs a short warm-up (allocations, first-call overheads, lazy loads), then TIMED_RUNS timed runs
with recording off (counters and timings only, identical tokens), so the numbers measure decoding, not the UI. The
table shows the median run and the range: one timed run on a shared CPU swings by ±15% between identical clicks.
"""
from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Callable, Generator, Iterator

import gradio as gr

from decoders.options import DecodeOptions, OptionsError
from decoders.controller import TREE_BOUNDS
from decoders.registry import uses_draft_model
from decoders.beams.trace import FAMILY as BEAM_FAMILY, BeamTrace
from decoders.trace import Trace

from app.shared.boxes import refuse_out_of_range
from app.shared.hosting import gpu
from app.shared.numbers import whole_field
from app.shared.loading import check_before_waiting, dtype_line, load_models, loaded, model_error_types
from app.shared.session import RunSession
from app.shared.words import counted
from app.tabs.generate.controls import DEFAULT_DRAFT
from app.shared.hosting import check_model_allowed
from app.figures.race import cost_curves_figure, cost_curves_note, leviathan_figure, race_row, race_table_html, \
    speed_figure
from app.tabs.race import curves
from app.tabs.race import load as machine_load
from app.figures.stats import totals
from app.tabs.race.verdicts import round_facts, verdicts_markdown, verify_ratio
from app.tabs.generate.views import error_html
from app.shared.decode_slot import DECODE_SLOT
from app.shared.errors import log_handled

RACE_OUTPUTS = ("race_status", "race_error", "race_table", "race_speed", "race_curve", "race_verdicts", "race_costs",
                "race_costs_note")
RACE_INPUTS = ("prompt", "model", "dtype", "draft_model", "methods", "max_new_tokens", "temperature", "seed")
MAX_METHODS = 3
WARMUP_TOKENS = 8
TIMED_RUNS = 3  # the median of three, with its range, instead of one noisy figure
TICK = 0.5  # seconds between two looks at Stop while a run computes (a look costs one yield, outside the timings)
STOP_WAIT = 15.0  # seconds the Stop button waits for the race to end before saying it is still stopping


COST_AWARE = dict(controller="cost")  # decoders/controller.py: each round drafts what this machine verifies profitably
# The trees' bounds under the controller: it grows up to D steps of K children and sends up to M nodes, less where the
# frontier or the verification cost says so. The papers' GPU shapes stay as named presets.
CONTROLLED_TREE = dict(drafter="eagle2", **TREE_BOUNDS, **COST_AWARE)
PRESETS = {
    "prompt lookup · cost-aware length": dict(drafter="prompt-lookup", rule="static", **COST_AWARE),
    "prompt lookup · static γ=4": dict(drafter="prompt-lookup", rule="static", gamma=4),
    "prompt lookup · heuristic": dict(drafter="prompt-lookup", rule="heuristic", gamma=4),
    "draft model · AdaEDL · cost-aware cap": dict(drafter="draft-model", rule="adaedl", **COST_AWARE),
    "draft model · static γ=4": dict(drafter="draft-model", rule="static", gamma=4),
    "draft model · AdaEDL (L_max 8)": dict(drafter="draft-model", rule="adaedl", max_draft=8),
    "draft model · max-confidence": dict(drafter="draft-model", rule="max-confidence", max_draft=8),
    "layer skip · AdaEDL · cost-aware cap": dict(drafter="layer-skip", rule="adaedl", **COST_AWARE),
    "layer skip · static γ=3": dict(drafter="layer-skip", rule="static", gamma=3),
    "early exit · AdaEDL (trained block, shared layers)": dict(drafter="early-exit", rule="adaedl", max_draft=8),
    "prophet · AdaEDL (trained decoder)": dict(drafter="prophet", rule="adaedl", max_draft=8),
    "EAGLE-2 tree · draft model · cost-aware": dict(CONTROLLED_TREE),
    "EAGLE-2 tree · EAGLE head · cost-aware": dict(CONTROLLED_TREE, eagle_head="auto"),
    "EAGLE-2 tree · draft model (paper: K10 D6 M59)": dict(drafter="eagle2", tree_k=10, tree_depth=6, tree_m=59),
    "DDD tree · draft model (paper: M59, checks at 5,7,9)": dict(drafter="ddd"),
    "EAGLE static tree · EAGLE head (24 nodes)": dict(drafter="eagle1", eagle_head="auto"),
    "suffix decoding · tree copied from prompt and output": dict(drafter="suffix"),  # no store: each timed run alike
    # Beams search for a different output than greedy decoding: raced for their speed and KV memory, not equality.
    "beam search · width 4 (temperature 0)": dict(method="beam-search", width=4),
    "beam sampling · width 4 (temperature > 0)": dict(method="beam-sampling", width=4),
    "DSBD · width 4 (temperature > 0)": dict(method="dsbd", width=4, gamma=4),
}
DEFAULT_METHODS = ["prompt lookup · cost-aware length", "prompt lookup · static γ=4"]
# The default race, chosen by measurement (bench/race_defaults.py; bench/results/race-defaults.md): a copy task, where
# prompt lookup finds most of the answer in the prompt (both lookup presets ~2.5x, 58-62% accepted, identical output
# on this CPU), on the model that races in about a minute here. The code edit won less clearly on SmolLM2 (tau 1.82).
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PROMPT = "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape."


def race_options(values: dict) -> list[DecodeOptions]:
    """Baseline first, then each chosen preset; validated (raises OptionsError)."""
    refuse_out_of_range(values.values())
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
        temperature = float(values.get("temperature") or 0.0)
        seed = whole_field(values, "seed", "seed (Generate tab, Sampling and length)", 0) if temperature else 0
        base = DecodeOptions(model=str(values.get("model") or DecodeOptions.model), dtype=values.get("dtype") or "auto",
                             max_new_tokens=whole_field(values, "max_new_tokens", "max new tokens (race)", 64),
                             temperature=temperature, seed=seed, record=False)
    except OptionsError:
        raise
    except (TypeError, ValueError) as err:
        raise OptionsError(f"race settings: {err}") from None
    check_model_allowed(base.model, "target model")
    check_model_allowed(draft if draft != DEFAULT_DRAFT else None, "draft model")
    runs = [base.validate()]
    for name in methods:
        run = replace(base, **{"method": "speculative", **PRESETS[name]})
        if uses_draft_model(run) and draft and draft != DEFAULT_DRAFT:
            run = replace(run, draft_model=draft)
        runs.append(run.validate())
    return runs


@gpu(duration=240)
def race_runs(options: list[dict], prompt: str) -> Iterator[dict]:
    """Warm up and time each run in turn, all inside one hold of the decode slot, so nothing else (another tab's
    run, a transcription, a model load) shares the machine between the baseline and the methods it is compared
    with. Yields {"waiting": line} while another run holds the slot, {"running": index, "phase": ...} at most every
    TICK seconds while a run computes (where Stop can close the race), and each finished trace as a plain dict (the
    median timed run)."""
    with DECODE_SLOT.queue(slot_name(len(options) - 1)) as turn:
        for line in turn.lines():
            yield {"waiting": line}
        with DECODE_SLOT.hold(_timed_runs(options, prompt), turn=turn) as lease:  # a streaming holder
            yield from lease.items()


def slot_name(n_methods: int) -> str:
    """What a race is called to the runs waiting behind it (app/shared/decode_slot.py)."""
    return f"a Race (the baseline and {counted(n_methods, 'method')})"


def _timed_runs(options: list[dict], prompt: str) -> Iterator[dict]:
    from decoders.api import stream

    baseline = None
    for index, data in enumerate(options):
        opts = DecodeOptions.from_dict(data)
        target, draft = load_models(opts)  # already loaded and held by race(): a cache hit
        warmup = replace(opts, max_new_tokens=min(WARMUP_TOKENS, opts.max_new_tokens))
        yield from _ticks(stream(warmup, prompt, target, draft), index, "its warm-up")
        timed, before = [], machine_load.snapshot()
        for run in range(TIMED_RUNS):
            if DECODE_SLOT.closing:  # the process waits at exit for this item: stop between runs, not after all
                return
            phase = f"timed run {run + 1} of {TIMED_RUNS}"
            timed.append((yield from _ticks(stream(opts, prompt, target, draft), index, phase)))
        chosen = median_run(timed)
        chosen.totals["race_load"] = machine_load.between(before, machine_load.snapshot())  # verdicts.py reads it
        baseline = baseline or chosen  # the baseline runs first
        if chosen is not baseline and isinstance(chosen, Trace):
            chosen.baseline_check = check_against(chosen, baseline, target)
        yield chosen.to_dict()


def check_against(run: Trace, baseline: Trace, target) -> dict:
    """decoders/compare.py's verdict, computed here where the target is loaded (a first difference is re-scored on
    it in float64); the table only renders it."""
    from decoders.compare import compare

    return compare(run, baseline, target.model).to_dict()


def _ticks(live: Iterator, index: int, phase: str) -> Generator[dict, None, object]:
    """Drain one run (its rounds), handing out {"running": index, "phase": phase} at most every TICK seconds, where
    the race can be closed (Stop: the run's `finally` frees its caches); returns the run's finished trace. The rounds'
    clock stops while a tick is out (decoders/clock.py), so ticks do not count in the timings."""
    trace, last = None, time.monotonic()
    try:
        for trace in live:
            if time.monotonic() - last >= TICK:
                yield {"running": index, "phase": phase}
                last = time.monotonic()
    finally:
        live.close()
    return trace


def median_run(traces: list[Trace]) -> Trace:
    """The run with the median decode time, carrying every run's tokens/s in totals["timed_tokens_per_second"]."""
    speeds = [totals(t)["tokens_per_second"] or 0.0 for t in traces]
    middle = sorted(range(len(traces)), key=lambda i: speeds[i])[len(traces) // 2]
    chosen = traces[middle]
    chosen.totals = {**totals(chosen), "timed_tokens_per_second": speeds}
    return chosen


def race(*values, progress=gr.Progress(), session: RunSession | None = None) -> Iterator[dict]:
    """The Race button. Stop (stop_race) ends it at its next step, between timed runs or inside one; the table keeps
    the methods that finished."""
    session = session if session is not None else RunSession()
    if not session.begin():
        yield {"race_status": "Cancelled: Stop was pressed while this race waited in the queue; nothing ran.",
               "race_error": ""}
        return
    try:
        yield from _race(dict(zip(RACE_INPUTS, values)), progress, session)
    finally:
        session.end()


def _race(controls: dict, progress, session: RunSession) -> Iterator[dict]:
    try:
        prompt = str(controls.get("prompt") or "")
        if not prompt.strip():
            raise OptionsError("the prompt is empty; type something for the model to continue, or pick an example")
        runs = race_options(controls)
        check_before_waiting(prompt, *runs)  # seconds: a model that cannot load here, a prompt over the cap
        yield {"race_status": "Loading models (after any run in another tab)…", "race_error": ""}
        with DECODE_SLOT.queue(slot_name(len(runs) - 1)) as turn:
            for line in turn.lines(stop=session.stop_requested.is_set):
                yield {"race_status": line}
            if turn.cancelled:
                yield {"race_status": NOT_STARTED}
                return
            with loaded(*runs, report=lambda f, m: progress(f, desc=m), turn=turn,
                        stop=session.stop_requested.is_set):
                yield from _raced(runs, prompt, session, progress)
    except OptionsError as err:
        yield _race_error(str(err))
    except (RuntimeError, ValueError, OSError, *model_error_types()) as err:
        yield _race_error(f"{type(err).__name__}: {err}", err)
    except Exception as err:  # never a traceback in the page; the server log keeps it (_race_error)
        yield _race_error(f"Unexpected error ({type(err).__name__}): {err}", err, unexpected=True)


NOT_STARTED = "Stopped before the race started: it was waiting for its turn; nothing ran."


def stop_race(session: RunSession | None) -> dict:
    """The Race's Stop: the race ends at its next step (between timed runs, or inside one within TICK seconds); the
    race itself then says which methods finished."""
    if session is None or (not session.running and not session.queued):
        return {"race_status": gr.skip(), "race_error": ""}
    was_running = session.running
    session.request_stop()
    if was_running and session.idle.wait(STOP_WAIT):
        return {"race_status": gr.skip(), "race_error": ""}  # the race's own last line says what finished
    return {"race_status": "Stopping the race at its next step (a model load cannot be interrupted)…",
            "race_error": ""}


def _raced(runs: list[DecodeOptions], prompt: str, session: RunSession,
           progress: Callable = lambda *a, **k: None) -> Iterator[dict]:
    """Each method's row as soon as it has run; a mismatch with the baseline is shown as an error. The status line
    and the progress bar over the results say which method and which of its runs is going (a bf16 baseline's
    minutes showed the load's "ready 100 %" until its row came, issue 47.5)."""
    traces: list[Trace] = []
    started, phase = time.monotonic(), None
    yield {"race_status": f"Racing 1/{len(runs)}: baseline (a warm-up, then {TIMED_RUNS} timed runs)…"}
    results = race_runs([o.to_dict() for o in runs], prompt)
    try:
        for data in results:
            if session.stop_requested.is_set():
                results.close()  # the running method's decoder closes now: its finally frees the caches
                yield {"race_status": _stopped_line(runs, traces, phase)}
                return
            if "waiting" in data:
                yield {"race_status": data["waiting"]}
                continue
            if "running" in data:
                if data != phase:
                    index = data["running"]
                    line = f"Racing {index + 1}/{len(runs)}: {_label(runs[index])}, {data['phase']}…"
                    progress((data["running"] + _phase_share(data["phase"])) / len(runs), desc=line)
                    yield {"race_status": line}
                phase = data
                continue
            traces.append(BeamTrace.from_dict(data) if data.get("family") == BEAM_FAMILY else Trace.from_dict(data))
            phase = None
            rows = [{**race_row(t, traces[0]), "t_ratio": verify_ratio(t, traces[0]) if isinstance(t, Trace) else None,
                     **round_facts(t)} for t in traces]
            done = len(traces) == len(runs)
            status = _done_line(traces[0], prompt, time.monotonic() - started) if done else \
                f"Racing {len(traces) + 1}/{len(runs)}: {_label(runs[len(traces)])} (a warm-up, then " \
                f"{TIMED_RUNS} timed runs)…"
            yield {"race_status": status, "race_table": race_table_html(rows), "race_speed": speed_figure(rows),
                   "race_curve": leviathan_figure(rows), "race_verdicts": verdicts_markdown(rows),
                   "race_error": _mismatch_error(rows),
                   **(cost_views(runs[0].model, runs[0].dtype, _device(traces[0])) if done else {})}
    finally:
        results.close()


def _phase_share(phase: str) -> float:
    """How far into one method's runs a phase is: its warm-up 0, "timed run k of n" k / (n + 1)."""
    match = re.fullmatch(r"timed run (\d+) of (\d+)", phase)
    return int(match[1]) / (int(match[2]) + 1) if match else 0.0


def _stopped_line(runs: list[DecodeOptions], traces: list, phase: dict | None) -> str:
    """What a stopped race leaves: which methods finished (their rows stay in the table) and where it stopped."""
    labels = ["the baseline"] + [_label(o) for o in runs[1:]]
    finished = labels[:len(traces)]
    rows = "its row stays" if len(finished) == 1 else "their rows stay"
    kept = f"{', '.join(finished)} finished ({rows} in the table)" if finished else "no method finished"
    if len(traces) >= len(labels):
        return f"Stopped: {kept}."
    where = labels[len(traces)] + (f", during {phase['phase']}" if phase else "")
    return f"Stopped: {kept}; stopped at {where}; its decoder closed and freed its caches."


def cost_views(model: str, dtype: str, device: str = "auto") -> dict:
    """The t(n) panel for the raced target: the curve of the device the race ran on (a cost-aware run has just
    measured it, if it never was) beside a GPU's from bench/results."""
    here, elsewhere = curves.this_machine(model, dtype, device), curves.measured_elsewhere()
    return {"race_costs": cost_curves_figure(here, elsewhere), "race_costs_note": cost_curves_note(here, elsewhere)}


def _device(trace) -> str:
    """The device the race's target ran on, as its trace recorded it."""
    return ((getattr(trace, "models", None) or {}).get("target") or {}).get("device", "auto")


def _mismatch_error(rows: list[dict]) -> str:
    """A real disagreement with the baseline is a bug, not a result: say so above the table."""
    bad = [row for row in rows if (row.get("check") or {}).get("kind") == "mismatch"]
    if not bad:
        return ""
    return error_html("; ".join(f"{row['label']} disagrees with the baseline at token "
                                f"{row['check']['position'] + 1}: {row['check']['reason']}" for row in bad) +
                      ". This is a bug in the decoder, not rounding; please report it with the trace.")


def _done_line(baseline: Trace, prompt: str, seconds: float) -> str:
    """What was raced, with its results: the prompt, the dtype (and why, for auto), the temperature."""
    shown = " ".join(prompt.split())
    shown = shown if len(shown) <= 80 else shown[:79] + "…"
    temperature = float((baseline.options or {}).get("temperature", 0.0))
    return (f"Done in {seconds:.1f} s · median of {TIMED_RUNS} timed runs per method · "
            f"{dtype_line(baseline, why=True)} · temperature {temperature:g}"
            f"{' (greedy)' if temperature == 0 else ''} · {counted(len(baseline.prompt_ids), 'prompt token')}: “{shown}”")


def _label(options: DecodeOptions) -> str:
    from decoders import label

    return label(options)


def _race_error(message: str, err: BaseException | None = None, unexpected: bool = False) -> dict:
    log_handled("Race", message, err, unexpected)
    gr.Warning(message)
    return {"race_status": "Not run: see the message.", "race_error": error_html(message)}
