"""Everything the Generate tab shows for a trace, bundled (pure: trace in, component values out)."""
from __future__ import annotations

import html
import json
import tempfile
from pathlib import Path

from decoders.trace import Trace

from app.figures.retokenize import retokenize_figure
from app.figures.rule import positions_figure, rounds_figure
from app.figures.self_draft import exit_figure
from app.figures import suffix
from app.figures.search import growth_figure, is_tree_trace, run_figure
from app.figures.stats import stats_figure, stats_html
from app.figures.text import legend_html, provenance_spans
from app.figures.tree import tree_figure

# The Generate tab's outputs, in the order every handler returns them (layout.py maps the names to components).
OUTPUTS = ("status", "error", "text", "tree", "positions", "rounds", "stats", "stats_plot", "slider", "state",
           "download", "legend", "self_draft", "store", "retokenized")
ROUND_OUTPUTS = ("tree", "positions", "rounds", "legend", "retokenized")  # what changes with the shown round
from app.tabs.generate.controls import OPENING_TRACE  # noqa: E402  the recorded run the page opens on (controls.py)
TRACE_DIR = Path(tempfile.gettempdir()) / "speclab-traces"
MAX_TRACE_BYTES = 20 * 1024 * 1024


def error_html(message: str) -> str:
    return f'<div class="sl-error">⚠ {html.escape(message)}</div>' if message else ""


def round_views(trace: Trace, index: int | None) -> dict:
    """The views of one round (default: the last); the legend outlines that round's tokens in the text."""
    if trace.rounds:
        index = len(trace.rounds) - 1 if index is None else max(0, min(int(index), len(trace.rounds) - 1))
    tree = is_tree_trace(trace)  # a tree drafter has no draft-length rule: its panels show the search instead
    if suffix.is_suffix_trace(trace):  # a tree copied from the text: its panels show the match instead
        this_round, over_run = suffix.match_figure, suffix.run_figure
    else:
        this_round, over_run = (growth_figure, run_figure) if tree else (positions_figure, rounds_figure)
    return {"tree": tree_figure(trace, index),
            "positions": this_round(trace, index),
            "rounds": over_run(trace, index),
            "legend": legend_html(trace, index if trace.rounds else None),
            "retokenized": retokenized_update(trace, index)}


def shown_round(trace: Trace) -> int:
    """The round a trace is shown on (0-based), for every view and the slider alike: the latest while running,
    an interesting one once finished."""
    if not trace.stop_reason:
        return max(len(trace.rounds) - 1, 0)
    if not is_tree_trace(trace):
        return interesting_round(trace)
    beats = tree_beats_chain_round(trace)  # a tree opens where it beats a chain, else where it kept the most drafts
    return most_accepted_round(trace) if beats is None else beats


def most_accepted_round(trace: Trace) -> int:
    """The round that kept the most drafts for its one target forward (ties: the earliest); 0 when none drafted."""
    return max(trace.rounds, key=lambda r: (r.n_accepted, -r.index)).index if trace.rounds else 0


def interesting_round(trace: Trace) -> int:
    """The round to open a finished trace on: the first with a rejected draft after an accepted one, else the
    first with a rejection, else the one that accepted most, else the last."""
    rounds = trace.rounds
    for test in (lambda r: r.n_accepted > 0 and r.n_accepted < r.n_drafted, lambda r: r.n_accepted < r.n_drafted):
        hit = next((r.index for r in rounds if test(r)), None)
        if hit is not None:
            return hit
    best = max(rounds, key=lambda r: r.n_accepted, default=None)
    return best.index if best is not None and best.n_accepted else max(len(rounds) - 1, 0)


def chain_gain(rnd) -> tuple[int, int] | None:
    """(depth where the accepted path leaves the draft's top-1 chain, tokens it accepted) for a tree round whose
    accepted path takes a draft's second-or-later choice somewhere; None when it never leaves the top-1 chain.

    A chain of the draft's top choices, grown with the same draft forwards, would have been rejected at that depth:
    it keeps depth − 1 tokens where the tree kept all of its accepted path."""
    children: dict[int, list] = {}
    for node in rnd.nodes:
        children.setdefault(node.parent, []).append(node)
    accepted = sorted((n for n in rnd.nodes if n.status == "accepted"), key=lambda n: n.depth)
    for node in accepted:
        top = max(children.get(node.parent, [node]), key=lambda m: m.q or 0.0)
        if top.id != node.id:
            return node.depth, len(accepted)
    return None


def tree_beats_chain_round(trace: Trace) -> int | None:
    """The round that shows best why a tree beats a chain: its accepted path leaves the draft's top-1 chain and goes
    furthest beyond where that chain would have stopped (ties: the longer accepted path, then the earlier round)."""
    best = None
    for rnd in trace.rounds:
        found = chain_gain(rnd)
        if found is None:
            continue
        depth, kept = found
        key = (kept - (depth - 1), kept, -rnd.index)
        if best is None or key > best[0]:
            best = (key, rnd.index)
    return best[1] if best is not None and best[0][1] >= 2 else None  # not a round that kept a single token


def full_views(trace: Trace, index: int | None = None, status: str = "", with_stats_plot: bool = True) -> dict:
    """Values for every output except 'download' (callers add it when a file exists). Default round: the
    latest while running, an interesting one once finished."""
    if index is None:
        index = shown_round(trace)
    views = {"status": status, "error": "", "text": provenance_spans(trace), "stats": stats_html(trace),
             "state": trace, "slider": slider_update(len(trace.rounds), index), **round_views(trace, index)}
    if with_stats_plot:
        views["stats_plot"] = stats_figure(trace)
    views["self_draft"] = self_draft_update(trace)
    return views


def self_draft_update(trace: Trace) -> dict:
    """The early-exit / prophet view (app/figures/self_draft.py), shown only for traces of those drafters."""
    import gradio as gr

    figure = exit_figure(trace)
    return gr.update(value=figure, visible=figure is not None)


def retokenized_update(trace: Trace, index: int | None) -> dict:
    """The two tokenizations of a cross-tokenizer round (app/figures/retokenize.py), shown only for that drafter."""
    import gradio as gr

    figure = retokenize_figure(trace, index)
    return gr.update(value=figure, visible=figure is not None)


def slider_update(n_rounds: int, index: int) -> dict:
    """A gr.update-style dict for the round slider (1-based for people)."""
    import gradio as gr

    return gr.update(minimum=1, maximum=max(n_rounds, 2), value=min(index, max(n_rounds - 1, 0)) + 1, step=1,
                     interactive=n_rounds > 1)


def write_trace_file(trace: Trace, stem: str = "speclab-trace") -> str:
    """Save the trace as JSON in the temp dir (Gradio serves files from there) and return the path."""
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=stem + "-", suffix=".json", dir=TRACE_DIR)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(trace.to_json(indent=1))
    return path


def read_trace_file(path: str | Path) -> Trace:
    """Load and validate a trace JSON; raises TraceError with a readable message."""
    from decoders.trace import TraceError

    path = Path(path)
    size = path.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise TraceError(f"the file is {size / 1e6:.1f} MB; traces up to {MAX_TRACE_BYTES // (1024 * 1024)} MB "
                         "can be loaded")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError("the file is not UTF-8 text; a trace is a JSON file saved by SpecLab") from None
    try:
        return Trace.from_json(text)
    except TraceError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as err:  # fields of the wrong type
        raise TraceError(f"the file does not match the trace format ({type(err).__name__}: {err})") from None


def opening_trace(recorded: dict[str, Path]) -> str | None:
    """The display name of the recorded run the page opens on (OPENING_TRACE, else the first one)."""
    return next((name for name, path in recorded.items() if path.name == OPENING_TRACE), next(iter(recorded), None))


def recorded_traces(folder: Path) -> dict[str, Path]:
    """Display name -> path for assets/traces/*.json (name from the trace's own label and prompt)."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            prompt = " ".join(str(data.get("prompt", "")).split())
            name = f"{data.get('label', path.stem)} — “{prompt[:40]}{'…' if len(prompt) > 40 else ''}”"
        except (OSError, ValueError):
            continue
        found[name] = path
    return found
