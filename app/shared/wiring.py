"""Glue between handlers that return dicts and Gradio events that want tuples, shared by every tab."""
from __future__ import annotations

import inspect

import gradio as gr


def as_tuple(names, comps):
    """Handler dict -> the tuple Gradio expects; missing names are left unchanged."""
    def convert(result: dict):
        return tuple(result[n] if n in result else gr.skip() for n in names)
    return convert


def with_specials(fn, names) -> None:
    """Give a *args handler an explicit signature (inputs..., request, progress) so Gradio injects gr.Request and
    tracks gr.Progress: it only looks for them among positional parameters, never after *args."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind) for n in names]
    params += [inspect.Parameter("request", kind, annotation=gr.Request),
               inspect.Parameter("progress", kind, default=gr.Progress())]
    fn.__signature__ = inspect.Signature(params)
    fn.__annotations__ = {"request": gr.Request}


