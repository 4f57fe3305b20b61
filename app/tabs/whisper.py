"""The Whisper tab: record or upload speech, transcribe it with several beam-search decoders side by side, and
scrub through each decoder's beam tree. Handlers return plain dicts (tests call them without a browser)."""
from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from app.figures.whisper import beam_figure, results_html
from app.shared.paths import ASSETS

AUDIO_DIR = ASSETS / "audio"
DECODERS = ("greedy", "beam", "filter-ends", "min-lookahead", "filter-ends+min-lookahead")  # = options.DECODERS
DEFAULT_DECODERS = ["beam", "filter-ends", "min-lookahead"]
LANGUAGES = {"en": "English", "vi": "Vietnamese", "fr": "French", "de": "German", "es": "Spanish",
             "it": "Italian", "pt": "Portuguese", "nl": "Dutch", "zh": "Chinese", "ja": "Japanese"}
OUTPUTS = ("status", "error", "results", "traces", "step") + tuple(f"tree_{i}" for i in range(len(DECODERS)))

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


def example_clips() -> dict[str, dict]:
    try:
        return json.loads((AUDIO_DIR / "clips.json").read_text())
    except (OSError, ValueError):
        return {}


def pick_example(name: str | None) -> tuple:
    clips = example_clips()
    if not name or name not in clips:
        return gr.skip(), gr.skip()
    return str(AUDIO_DIR / name), clips[name]["reference"]


def transcribe_all(audio, reference: str, model: str, language: str, decoders: list[str], beam_size: int,
                   eot_margin: float, depth: int, aggregate: str) -> dict:
    """Every chosen decoder on the clip; a dict of output name -> value (errors become one-line messages)."""
    from decoders.options import OptionsError
    from decoders.whisper.audio import AudioError, load_file, prepare
    from decoders.whisper.models import ModelError
    from decoders.whisper.options import WhisperOptions
    from decoders.whisper.task import transcribe

    if audio is None:
        return _error("Record or upload a clip first (or pick an example).")
    if not decoders:
        return _error("Choose at least one decoder.")
    try:
        clip = prepare(audio[1], audio[0]) if isinstance(audio, tuple) else load_file(audio)
        traces = [transcribe(clip, WhisperOptions(model=model, decoder=d, language=language, beam_size=int(beam_size),
                                                  eot_margin=float(eot_margin), lookahead_depth=int(depth),
                                                  lookahead_aggregate=aggregate))
                  for d in sorted(decoders, key=DECODERS.index)]
    except (AudioError, OptionsError, ModelError) as err:
        return _error(str(err))
    steps = max(len(t.steps) for t in traces)
    return {"status": f"{clip.name}: {clip.seconds:.1f} s at {clip.source_rate} Hz · {model} · {language}",
            "error": "", "results": results_html(traces, reference or ""), "traces": [t.to_dict() for t in traces],
            # Gradio refuses a slider whose minimum equals its maximum: a one-step search gets 1..2, hidden.
            "step": gr.update(maximum=max(2, steps), value=steps, visible=steps > 1), **_trees(traces, steps - 1)}


def show_step(trace_dicts: list[dict] | None, step: int) -> dict:
    from decoders.whisper.trace import WhisperTrace

    traces = [WhisperTrace.from_dict(d) for d in trace_dicts or []]
    return _trees(traces, int(step) - 1)


def _trees(traces: list, step: int) -> dict:
    out = {}
    for i in range(len(DECODERS)):
        if i < len(traces):
            out[f"tree_{i}"] = gr.update(value=beam_figure(traces[i], step, traces[0] if i else None), visible=True)
        else:
            out[f"tree_{i}"] = gr.update(value=None, visible=False)
    return out


def _error(message: str) -> dict:
    return {"status": "", "error": f'<div class="sl-error" id="sw-error-msg">{message}</div>', "results": gr.skip(),
            "traces": gr.skip(), "step": gr.skip(), **{f"tree_{i}": gr.skip() for i in range(len(DECODERS))}}


def build() -> dict:
    """The tab's components and events; call inside a gr.Tab. Returns the inputs a lesson's "try it" fills."""
    from decoders.whisper.models import whisper_models

    gr.Markdown("Transcribe speech with Whisper and watch the beam searches decide. Clips up to 30 s (one Whisper "
                "window), 16 kHz mono after conversion. **Filter-Ends and Min Lookahead are SpecLab's "
                "reconstructions**: the paper's (arXiv 2309.10299) exact definitions were not retrievable.")
    clips = example_clips()
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            audio = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Speech (wav, flac, ogg, mp3)",
                             elem_id="sw-audio")
            example = gr.Dropdown(list(clips), value=None, label="Example clips (LibriVox, with references)",
                                  elem_id="sw-example")
            reference = gr.Textbox(label="Reference transcript (optional: gives WER)", elem_id="sw-reference")
            run = gr.Button("Transcribe", variant="primary", elem_id="sw-run")
        with gr.Column(scale=1, min_width=320):
            model = gr.Dropdown(whisper_models(), value="whisper-tiny.en", label="Model", elem_id="sw-model")
            language = gr.Dropdown([(f"{v} ({k})", k) for k, v in LANGUAGES.items()], value="en", label="Language",
                                   info="whisper-tiny.en is English-only", elem_id="sw-language")
            decoders = gr.CheckboxGroup(list(DECODERS), value=DEFAULT_DECODERS, label="Decoders", elem_id="sw-decoders")
            beam_size = gr.Slider(2, 8, value=5, step=1, label="beam size")
            eot_margin = gr.Slider(0, 5, value=1.0, step=0.1, label="Filter-Ends margin (nats)")
            depth = gr.Slider(1, 4, value=2, step=1, label="lookahead depth (greedy steps)")
            aggregate = gr.Radio(["min", "mean", "sum"], value="min", label="lookahead aggregate")
    out = {"status": gr.Markdown("", elem_id="sw-status"), "error": gr.HTML("", elem_id="sw-error"),
           "results": gr.HTML(results_html([]), elem_id="sw-results-box"), "traces": gr.State([]),
           "step": gr.Slider(1, 2, value=1, step=1, label="step (scrub through the search)", visible=False,
                             elem_id="sw-step")}
    with gr.Row(elem_id="sw-trees"):
        for i in range(len(DECODERS)):
            out[f"tree_{i}"] = gr.Plot(None, visible=False, elem_id=f"sw-tree-{i}", label="beam tree")
    with gr.Accordion("What each decoder does", open=False):
        gr.Markdown(STATEMENTS, elem_id="sw-statements")
    outs = [out[n] for n in OUTPUTS]
    inputs = [audio, reference, model, language, decoders, beam_size, eot_margin, depth, aggregate]
    run.click(lambda *a: tuple(transcribe_all(*a)[n] for n in OUTPUTS), inputs, outs, concurrency_limit=1,
              concurrency_id="whisper", api_name="whisper_transcribe")
    tree_names = [f"tree_{i}" for i in range(len(DECODERS))]
    out["step"].input(lambda t, s: tuple(show_step(t, s)[n] for n in tree_names), [out["traces"], out["step"]],
                      [out[n] for n in tree_names], trigger_mode="always_last", api_name="whisper_step")
    example.input(pick_example, [example], [audio, reference])
    return {"audio": audio, "example": example, "reference": reference, "decoders": decoders}
