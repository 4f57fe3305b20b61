"""The Batch tab's layout and events: prompts (one per line) and Run, the lanes, one row's rounds, throughput."""
from __future__ import annotations

import gradio as gr

from app.shared.boxes import SCRUB, Bounded, Scrubber

from decoders.batch import batched_drafters

from app.figures.batch import LANES_JS, lanes_html, throughput_figure
from app.shared.decode_slot import QUEUE_LIMIT
from app.shared.hosting import registry_only
from app.shared.session import RunSession
from app.shared.theme import PROVENANCE_COLORS, empty_figure
from app.figures.text import legend_html
from app.shared.wiring import as_tuple
from app.tabs.batch import handlers

INTRO = ("**Batch**: several prompts decoded together, one row each. In speculative decoding each row accepts a "
         "different number of drafts per round, so rows advance at different rates and their caches, positions and "
         "masks fall out of step; SpecLab realigns them so that every row's output equals that row decoded alone "
         "(with its own seed when sampling). Each lane below is a row; click a lane to open its rounds.")


def _models() -> list[str]:
    try:
        from decoders.runtime.models import available_models

        return available_models()
    except ImportError:
        return ["smollm2-135m"]


def build() -> None:
    """The tab's components and events; call inside a gr.Tab."""
    gr.Markdown(INTRO, elem_id="bt-intro")
    models = _models()
    with gr.Row():
        with gr.Column(scale=3, min_width=320):
            prompts = gr.Textbox(handlers.EXAMPLE_PROMPTS, lines=5, label="Prompts (one per line, 1 to 8 rows)",
                                 elem_id="bt-prompts")
            with gr.Row():
                run = gr.Button("Run batch", variant="primary", elem_id="bt-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="bt-stop")
        with gr.Column(scale=2, min_width=280):
            method = gr.Radio(list(handlers.METHODS), value="batched speculative", label="Method", elem_id="bt-method")
            drafter = gr.Dropdown(list(batched_drafters()), value="prompt-lookup", label="Drafter (speculative)",
                                  elem_id="bt-drafter")
            model = gr.Dropdown(models, value="smollm2-135m" if "smollm2-135m" in models else models[0],
                                label="Target model", allow_custom_value=not registry_only(), elem_id="bt-model")
        with gr.Column(scale=2, min_width=280):
            max_tokens = Bounded(1, 256, value=32, step=1, label="max tokens per row", elem_id="bt-max")
            temperature = Bounded(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)",
                                    elem_id="bt-temp")
            seeds = gr.Textbox("", label="seeds (one, or one per row; sampling only)", elem_id="bt-seeds")
    out = {"status": gr.Markdown("", elem_id="bt-status"), "error": gr.HTML("", elem_id="bt-error"),
           "lanes": gr.HTML(lanes_html(None), elem_id="bt-lanes", js_on_load=LANES_JS),
           "stats": gr.HTML("", elem_id="bt-stats")}
    out["row_title"] = gr.Markdown("", elem_id="bt-row-title")
    out["row_text"] = gr.HighlightedText(label="this row's text, coloured by where each token came from",
                                         color_map=PROVENANCE_COLORS, show_legend=False, show_inline_category=False,
                                         combine_adjacent=False, interactive=False, elem_id="bt-row-text")
    out["legend"] = gr.HTML(legend_html(), elem_id="bt-legend")
    out["slider"] = Scrubber(1, 2, value=1, step=1, elem_classes=SCRUB, label="round of this row", elem_id="bt-round")
    with gr.Row():
        out["tree"] = gr.Plot(empty_figure("Run a batch, then click a lane: that row's round opens here."),
                              label="the row's round", elem_id="bt-tree", min_width=360)
        out["rounds"] = gr.Plot(empty_figure("That row's rounds open here."), label="the row's rounds",
                                elem_id="bt-rounds", min_width=360)
    out["row_stats"] = gr.HTML("", elem_id="bt-row-stats")
    out["state"] = gr.State(None)
    out["row"] = gr.State(0)
    with gr.Accordion("Throughput: tokens/s against B", open=True):
        measure = gr.Button("Measure here: B = 1, 2, 4 on the prompts above, now", elem_id="bt-measure")
        rows, grid, where = handlers.recorded_throughput("smollm2-135m")
        first = handlers.throughput_views(rows, grid, where)
        throughput = gr.Plot(first["throughput"], label="tokens/s against B", elem_id="bt-throughput")
        why = gr.HTML(first["why"], elem_id="bt-why")
    session = gr.State(RunSession())
    outs = [out[n] for n in handlers.OUTPUTS]
    to_tuple = as_tuple(handlers.OUTPUTS, out)

    def run_fn(p, mo, me, d, mx, t, s, run_session, progress=gr.Progress()):
        results = handlers.run_batch(p, mo, me, d, mx, t, s, session=run_session, progress=progress)
        try:
            for result in results:
                yield to_tuple(result)
        finally:
            results.close()

    run.click(run_fn, [prompts, model, method, drafter, max_tokens, temperature, seeds, session], outs,
              concurrency_limit=QUEUE_LIMIT, concurrency_id="decode", api_name="batch_run")
    stop_btn.click(handlers.stop, [session], [out["status"]], api_name="batch_stop")
    row_outs = [out[n] for n in handlers.ROW_OUTPUTS]
    row_tuple = as_tuple(handlers.ROW_OUTPUTS, out)

    def lane_fn(state, evt: gr.EventData):
        return row_tuple(handlers.open_row(state, getattr(evt, "row", 0)))

    out["lanes"].click(lane_fn, [out["state"]], row_outs, api_name="batch_lane")
    out["slider"].input(lambda st, r, v: row_tuple(handlers.show_round(st, r, v)), [out["state"], out["row"],
                        out["slider"]], row_outs, trigger_mode="always_last", api_name="batch_round")

    def measure_fn(p, mo, d, mx, run_session):
        for result in handlers.measure_here(p, mo, d, mx, session=run_session):
            yield result.get("throughput", gr.skip()), result.get("why", gr.skip())

    measure.click(measure_fn, [prompts, model, drafter, max_tokens, session], [throughput, why],
                  concurrency_limit=QUEUE_LIMIT, concurrency_id="decode", api_name="batch_measure")

    def recorded_fn(mo):  # another target: its recorded figures (bench/results/batch-<target>.json), if any
        result = handlers.throughput_views(*handlers.recorded_throughput(mo))
        return result["throughput"], result["why"]

    model.input(recorded_fn, [model], [throughput, why], api_name="batch_recorded")

