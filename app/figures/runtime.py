"""One line on how a run executed, from the trace's own record (Trace.runtime, set by the decoder): the machine, how
each model kept its KV cache, and which forwards replayed a captured CUDA graph. Nothing here is guessed: an older
trace without the record says so."""
from __future__ import annotations

import html

from decoders.trace import Trace

KV_WORDS = {"dynamic": "DynamicCache (grows by concatenation)", "static": "static buffers (read as growing views)",
            "fixed": "static buffers at fixed shapes"}
HOVER = ("How this run executed, as the decoder recorded it. KV cache: transformers' DynamicCache, or SpecLab's "
         "preallocated buffers (decoders/runtime/buffers.py), which a fixed-shape run reads whole at padded widths. CUDA graph: "
         "a forward captured once and replayed (decoders/runtime/graphs.py); eager: run op by op. A CPU runs every forward "
         "eagerly. Widths: the padded sizes the forwards ran at; with graphs each width's replay is timed once per "
         "device, model, dtype and kernels and stored, and a forward pads to the cheapest width that holds it (on a "
         "GPU a wider one can be faster; every later run reads the stored timing, so it pads alike).")


def runtime_line(trace: Trace) -> str:
    """Plain text: where the run ran and how each model's forwards ran."""
    runtime = trace.runtime
    if not runtime:
        return "Ran on: not recorded (a trace saved before SpecLab recorded how a run executed)"
    parts = [f"Ran on {runtime.get('machine', '?')} ({runtime.get('device', '?')})"]
    for role in ("target", "draft"):
        if runtime.get(role):
            parts.append(f"{role}: {_model_line(runtime[role])}")
    return " · ".join(parts)


def _model_line(model: dict) -> str:
    kind = model.get("kv_cache", "?")
    words = KV_WORDS.get(kind, kind)
    if model.get("capacity"):
        words += f", {model['capacity']} slots"
    if kind != "fixed":
        return f"{words}, every forward eager"
    graph, eager = model.get("graph", 0), model.get("eager", 0)
    widths = ", ".join(str(w) for w in model.get("widths", []))
    if not graph:
        return f"{words}, all {eager} forwards eager (widths {widths})"
    line = f"{words}, {graph} of {graph + eager} forwards replayed as CUDA graphs, {eager} eager (widths {widths})"
    if model.get("bucket_ms"):
        timed = ", ".join(f"{w}: {ms:.1f}" for w, ms in model["bucket_ms"].items())
        line += f", each padded to the cheapest timed width (ms per replay: {timed})"
    return line


def runtime_html(trace: Trace) -> str:
    return f'<div class="sl-runtime" title="{html.escape(HOVER)}">{html.escape(runtime_line(trace))}</div>'
