"""The Whisper tab's layout and wiring: every event calls one handler once (handlers.py), whose dict becomes the
tuple Gradio wants. Stop reaches a running transcription through this tab's RunSession (app/shared/session.py)."""
from __future__ import annotations

import gradio as gr

from app.shared.boxes import SCRUB, Bounded, Scrubber

from app.figures.whisper import results_html
from app.shared.decode_slot import QUEUE_LIMIT
from app.shared.session import RunSession
from app.shared.wiring import as_tuple
from app.tabs.whisper import handlers
from app.tabs.whisper.handlers import DECODERS, DEFAULT_DECODERS, LANGUAGES, OUTPUTS, RUN_INPUTS, TREES

STATEMENTS = """
**greedy**: takes the most likely token at every step; one path, no search.

**standard beam search**: Whisper's own `BeamSearchDecoder`, reproduced token for token: every live beam proposes
its B+1 best next tokens, the B best non-ending candidates by cumulative log-probability stay alive, candidates
ending in end-of-text (EOT) that rank above them go to the finished pool; the search stops when round(B·patience)
candidates finished, and the finished one with the best length-normalised score wins.

**Filter-Ends (SpecLab's reconstruction)**: the paper's exact definition could not be retrieved, so this is our
reading of the name. An ending may enter the finished pool only if the model's log-probability of EOT is within a
margin of its best other token after the same beam. Standard beam search lets an ending in whenever its
cumulative score ranks high, even when the model itself would rather go on; such premature endings fill the pool
and stop the search early, which can cut transcripts short.

**Min Lookahead (SpecLab's reconstruction)**: again our reading, not the paper's verified method. Every live
candidate is rolled forward a few greedy steps and ranked by its score plus the minimum (or mean / sum) of the
rollout's log-probabilities, so a candidate that leads into a stretch the model finds implausible loses its
place before the search commits to it. Only which beams survive changes; endings are judged as in Whisper. The
rollouts run on a detached copy of the key/value cache, so they cannot corrupt the search (tested).
"""


def build() -> dict:
    """The tab's components and events; call inside a gr.Tab. Returns the inputs a lesson's "try it" fills."""
    from decoders.whisper.models import whisper_models

    gr.Markdown("Transcribe speech with Whisper and watch the beam searches decide. Clips up to 30 s (one Whisper "
                "window), 16 kHz mono after conversion. **Filter-Ends and Min Lookahead are SpecLab's "
                "reconstructions**: the paper's (arXiv 2309.10299) exact definitions were not retrievable.")
    clips = handlers.example_clips()
    c = {}
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            default = handlers.DEFAULT_CLIP if handlers.DEFAULT_CLIP in clips else None  # a first click teaches
            c["audio"] = gr.Audio(str(handlers.AUDIO_DIR / default) if default else None,
                                  sources=["upload", "microphone"], type="filepath",
                                  label="Speech (wav, flac, ogg, mp3)", elem_id="sw-audio")
            example = gr.Dropdown(list(clips), value=default, label="Example clips (LibriVox, with references)",
                                  elem_id="sw-example")
            c["reference"] = gr.Textbox(clips[default]["reference"] if default else "", elem_id="sw-reference",
                                        label="Reference transcript (optional: gives WER)")
            with gr.Row():
                run_btn = gr.Button("Transcribe", variant="primary", elem_id="sw-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="sw-stop")
            # right under Transcribe, where the eye is while it runs (below both columns it was off screen)
            status = gr.Markdown("", elem_id="sw-status")
            error = gr.HTML("", elem_id="sw-error")
        with gr.Column(scale=1, min_width=320):
            c["model"] = gr.Dropdown(whisper_models(), value="whisper-tiny.en", label="Model", elem_id="sw-model")
            c["language"] = gr.Dropdown([(f"{v} ({k})", k) for k, v in LANGUAGES.items()], value="en",
                                        label="Language", info="whisper-tiny.en is English-only",
                                        elem_id="sw-language")
            c["decoders"] = gr.CheckboxGroup(list(DECODERS), value=DEFAULT_DECODERS, label="Decoders",
                                             elem_id="sw-decoders")
            c["beam_size"] = Bounded(2, 8, value=5, step=1, label="beam size")
            c["eot_margin"] = Bounded(0, 5, value=1.0, step=0.1, label="Filter-Ends margin (nats)")
            c["depth"] = Bounded(1, 4, value=2, step=1, label="lookahead depth (greedy steps)")
            c["aggregate"] = gr.Radio(["min", "mean", "sum"], value="min", label="lookahead aggregate")
    out = {"status": status, "error": error,
           "results": gr.HTML(results_html([]), elem_id="sw-results-box"), "traces": gr.State([]),
           "step": Scrubber(1, 2, value=1, step=1, elem_classes=SCRUB, label="step (scrub through the search)", visible=False,
                             elem_id="sw-step")}
    gr.Markdown("**Beam trees**, one per decoder, stacked on one step axis: black = the path of the chosen "
                "transcript, faded = candidates the search dropped; a dashed purple line marks the token where a "
                "decoder leaves the first decoder's transcript. ␣ is a space at the start of a token. Hover a node "
                "for its log-probability and score.", elem_id="sw-trees-help")
    with gr.Column(elem_id="sw-trees"):  # stacked full width: steps line up across trees, nothing cut on a phone
        for i, name in enumerate(TREES):
            out[name] = gr.Plot(None, visible=False, elem_id=f"sw-tree-{i}", show_label=False)
    with gr.Accordion("What each decoder does", open=False):
        gr.Markdown(STATEMENTS, elem_id="sw-statements")
    session = gr.State(RunSession())  # this tab's runs, for Stop; per browser session, server-side
    _wire(c, out, session, run_btn, stop_btn)
    example.input(handlers.pick_example, [example], [c["audio"], c["reference"]])
    return {"audio": c["audio"], "example": example, "reference": c["reference"], "decoders": c["decoders"]}


def _wire(c: dict, out: dict, session, run_btn, stop_btn) -> None:
    """One handler call per event: Transcribe streams handlers.run's dicts; the step slider redraws from gr.State."""
    to_tuple = as_tuple(OUTPUTS, out)

    def run_fn(*args):  # (the RUN_INPUTS values..., session)
        results = handlers.run(*args[:-1], session=args[-1])
        try:
            for result in results:
                yield to_tuple(result)
        finally:  # Gradio closes run_fn when the page goes away or the job is cancelled: close the decode now
            results.close()

    def admit_fn(*args):  # the validator runs when Gradio queues the click: Stop can then cancel a queued run
        if isinstance(args[-1], RunSession):
            args[-1].admit()
        return [gr.validate(True, "") for _ in args]

    run_btn.click(run_fn, [c[n] for n in RUN_INPUTS] + [session], [out[n] for n in OUTPUTS],
                  concurrency_limit=QUEUE_LIMIT, concurrency_id="whisper", api_name="whisper_transcribe", validator=admit_fn)
    stop_btn.click(lambda s: as_tuple(("status", "error"), out)(handlers.stop(s)), [session],
                   [out["status"], out["error"]], api_name="whisper_stop")
    tree_tuple = as_tuple(TREES, out)
    out["step"].input(lambda t, s: tree_tuple(handlers.show_step(t, s)), [out["traces"], out["step"]],
                      [out[n] for n in TREES], trigger_mode="always_last", api_name="whisper_step")
