"""The walkthrough: short lessons, each drawn from a recorded trace in assets/traces/ (instant, no model load), with
a "try it" button that puts the lesson's settings into the Generate tab so the class can re-run it live.

Lessons are data in one list, LESSONS: a new method's lesson is one entry here (a recorded trace, a figure kind
from FIGURES, a few sentences). An entry with `coming` set is listed as coming and draws nothing.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field, fields
from pathlib import Path

import plotly.graph_objects as go

from decoders.beams.trace import BeamTrace, load_any
from decoders.options import DecodeOptions
from decoders.trace import Trace
from decoders.whisper.record import WhisperSet

from app.tabs.learn import explainer
from app.tabs.generate.controls import EXAMPLE_CONTROLS, example_states
from app.figures.whisper import beam_figure, results_html
from app.figures.forest import forest_figure
from app.figures.rule import positions_figure
from app.figures.search import growth_figure
from app.figures.self_draft import exit_figure
from app.figures.suffix import run_figure as suffix_run_figure
from app.figures.training import acceptance_figure, shipped_scores
from app.figures.tree import empty_figure, tree_figure
from app.shared.theme import OKABE_ITO, describe, legend_below, title_margin, wrap_title
from app.tabs.generate.views import interesting_round, read_trace_file, tree_beats_chain_round
from app.shared.paths import ASSETS

TRACES = ASSETS / "traces"


@dataclass(frozen=True)
class Lesson:
    title: str
    tab: str  # the short tab label (the lessons fit one row of tabs on a laptop; a picker above them on a phone)
    text: str  # a few sentences, Markdown
    figure: str  # a key of FIGURES
    trace: str = ""  # file name in assets/traces/ ("" for a figure that needs no trace)
    coming: str = ""  # non-empty: the method has not landed or has no recorded trace yet; says what is missing
    settings: dict = field(default_factory=dict)  # DecodeOptions fields "try it" sets over the trace's own


def speedup_figure(_trace: Trace | None = None, height: int = 340) -> go.Figure:
    """Leviathan's S(α, γ, c) against γ for a few α and draft costs c: why a cheap, accurate draft pays most."""
    fig = go.Figure()
    gammas = list(range(1, 11))
    for alpha, color in ((0.5, OKABE_ITO["vermillion"]), (0.7, OKABE_ITO["orange"]), (0.9, OKABE_ITO["blue"])):
        for cost, dash in ((0.0, "solid"), (0.3, "dot")):
            s = [(1 - alpha ** (g + 1)) / ((1 - alpha) * (g * cost + 1)) for g in gammas]
            fig.add_scatter(x=gammas, y=s, name=f"α = {alpha}, c = {cost}", line=dict(color=color, dash=dash))
    title = wrap_title("Expected speed-up S(α, γ, c) · Leviathan et al. 2023 · assumes t(γ+1) = t(1)")
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=height, plot_bgcolor="white",
                      xaxis=dict(title="γ (tokens drafted per round)"), yaxis=dict(title="S (× baseline)"),
                      legend=legend_below(), margin=dict(l=50, r=10, t=title_margin(title), b=10))
    return describe(fig, "Expected speed-up against draft length for acceptance 0.5, 0.7 and 0.9, with free (c = 0) "
                         "and costly (c = 0.3) drafts: a costly draft peaks at a short γ.")


def _round_tree(trace: Trace) -> go.Figure:
    """A chain's lesson opens on its interesting round; a tree's on the round that shows why a tree beats a chain
    (views.tree_beats_chain_round), where there is one."""
    shown = tree_beats_chain_round(trace) if any(r.search for r in trace.rounds) else None
    return tree_figure(trace, interesting_round(trace) if shown is None else shown)


def _round_positions(trace: Trace) -> go.Figure:
    return positions_figure(trace, interesting_round(trace))


def _rejection(_trace: Trace | None) -> go.Figure:
    return explainer.position_figure(explainer.toy_position(0.5))


def _growth(trace: Trace) -> go.Figure:
    return growth_figure(trace, interesting_round(trace))


def _forest(trace: BeamTrace) -> go.Figure:
    """The iteration whose forest shows most: the one with the most draft nodes judged (DSBD) or kept."""
    busiest = max(range(len(trace.iterations)), key=lambda i: len(trace.iterations[i]["nodes"]), default=0)
    return forest_figure(trace, busiest)


def _whisper_search(recorded: WhisperSet) -> go.Figure:
    """The first decoder whose transcript differs from the first one's (else the second), its whole beam tree with
    the path drawn thick from where it leaves the first decoder's."""
    first, others = recorded.traces[0], recorded.traces[1:] or recorded.traces
    shown = next((t for t in others if t.output_ids != first.output_ids), others[0])
    return beam_figure(shown, None, first if shown is not first else None)


def _self_draft(trace: Trace) -> go.Figure:
    return exit_figure(trace) or empty_figure("This trace was not drafted by early exit or a prophet.")


def _acceptance(_trace: Trace | None) -> go.Figure:
    return acceptance_figure(shipped_scores())


FIGURES = {"tree": _round_tree, "positions": _round_positions, "rejection": _rejection, "speedup": speedup_figure,
           "growth": _growth, "forest": _forest, "whisper": _whisper_search, "self_draft": _self_draft,
           "suffix": suffix_run_figure, "acceptance": _acceptance}

LESSONS: list[Lesson] = [
    Lesson("1. One token per forward", "Baseline",
           "A language model writes one token per forward pass of the whole network: the **baseline**. Each "
           "pass reads every weight from memory, so on most hardware the time goes to moving weights, not to "
           "arithmetic. Everything that follows tries to get more than one token out of each pass.",
           "tree", "baseline-chat.json"),
    Lesson("2. Draft and verify", "Draft & verify",
           "A cheap **drafter** guesses γ tokens; the **target** checks them all in ONE forward pass. Matching "
           "tokens are **accepted** (green), the first mismatch is **rejected** (black cross) and replaced by the "
           "target's own token, and when every guess survives the target adds a **bonus** token for free. Here "
           "the drafter is prompt lookup: it copies text that already appears in the prompt, ideal for an edit.",
           "tree", "lookup-code-edit.json"),
    Lesson("3. Why sampling stays exact", "Sampling",
           "When the model samples, the target accepts a drafted token with probability min(1, p/q) and, on "
           "rejection, draws from the residual norm(max(p − q, 0)). Accepted mass plus residual rebuild p "
           "exactly: the output has the target's distribution whatever the draft. Press *Sample 1,000 times* "
           "in the explainer below the lessons to watch the histogram converge to p.",
           "rejection", "static-layerskip-sampled.json"),
    Lesson("4. How long to draft", "Draft length",
           "A **static** rule always drafts γ tokens; when the draft is unsure, the last guesses are wasted. "
           "**AdaEDL** estimates from the draft's entropy how likely the next guess is to survive, and stops "
           "when the bound 1 − √(γ·H(q)) falls below λ. The figure shows each drafted position's bound and λ.",
           "positions", "adaedl-layerskip-chat.json"),
    Lesson("5. Trees: EAGLE-2 and DDD", "Trees",
           "Instead of one chain of guesses, **EAGLE-2** grows a **tree**: each step expands the most promising "
           "leaves with their K likeliest next tokens and scores every candidate by its **value**, the product of "
           "the draft's probabilities along its path (darker = higher). The M most valuable candidates go to the "
           "target in ONE forward pass with a tree-shaped attention mask; the grey *+n* marks fold the candidates "
           "that were grown but not sent. The target keeps the longest branch it agrees with. The round shown is "
           "one where that branch (green) leaves the draft's first choice: a chain of first choices, grown with the "
           "same draft forwards, would have been rejected there, while the tree goes on deeper. Here the tree is "
           "grown by the **draft model** of the Qwen2.5-Coder pair (0.5B for 1.5B) on a code prompt. **Why a head "
           "must be trained**: the recorded *EAGLE-head tree* run (Generate tab, Recorded runs) grows the same kind "
           "of tree from SmolLM2's EAGLE head, one small layer, recorded when it had trained 35 minutes on a CPU; it "
           "accepted about 40% at depth 1 where published heads reach 70–80% (lesson 11 shows where training has "
           "taken it since), so only 1% of its drafts survived (τ 1.85) "
           "and its trees cost more than they gained. **DDD** grows the same tree but stops early when the "
           "frontier's total confidence H falls below x: pick *ddd* and watch the panel beside the tree.",
           "tree", "eagle2-qwen-code.json"),
    Lesson("6. Beams and forests", "Beams",
           "**Beam search** keeps several sequences (beams) alive and extends each with its best next tokens; "
           "**beam sampling** draws them instead. **DSBD** makes beam sampling fast: the small model drafts a "
           "**forest** (one tree per beam) a few layers deep, the target verifies the whole forest in one "
           "forward, and each layer keeps as many beams as the draft's agreement allows. Thick paths are the "
           "beams carried forward. Run it live on the **Beams** tab.", "forest", "beams/dsbd-qwen-code.json"),
    Lesson("7. Whisper's beam search and its alternatives", "Whisper",
           "Whisper turns speech into text one token at a time too. **Greedy** decoding takes the likeliest token "
           "at every step and never looks back. **Beam search** keeps B = 5 partial transcripts (beams) alive, "
           "extends each with its likeliest next tokens, moves candidates that end (EOT, squares) into a finished "
           "pool and, once B have finished, picks the best by length-normalised log-probability. In this LibriVox "
           "clip greedy writes *old-sposed*: *old* led *ill* by a hair when it had to choose. Beam search kept both; "
           "one token later *ill-* took the lead and *ill-disposed* won (thick purple: where its path leaves "
           "greedy's). **Filter-Ends** "
           "lets an ending in only when the model itself prefers to stop; **Min Lookahead** ranks beams by a short "
           "greedy look ahead. Both are SpecLab's reconstructions: the paper's exact definitions were not "
           "retrievable. Hover a node for its log-probability and score.",
           "whisper", "whisper/librivox-0880.json"),
    Lesson("8. What speed-up to expect", "Speed-up",
           "Leviathan's formula predicts the speed-up from the acceptance rate **α**, the draft length **γ** and "
           "the draft's cost **c** relative to the target. It assumes verifying γ+1 tokens costs one target step, "
           "t(γ+1) = t(1): nearly true on a GPU, false on a small CPU, where t(n) grows with n. The Race tab "
           "and the Claims tab show the measured numbers next to this prediction.",
           "speedup", "lookup-code-edit.json"),
    Lesson("9. Drafting from inside the target: early exit, prophet, EAGLE head", "Self-drafting",
           "A drafter need not be a second model: the target can draft for itself. **Early exit** runs only the "
           "target's first k layers, then one small trained block and the target's own LM head. Those first k "
           "layers are **shared**: the draft already wrote their cache and outputs for every drafted token, so "
           "verification runs only layers k+1..L (blue: shared; grey: verification only; orange: the trained "
           "block). A **prophet** is a small trained decoder fed the target's last hidden state; it then drafts "
           "on its own, cheaply but with no context of its own. An **EAGLE head** (lesson 5) sits between them: "
           "one trained layer that reads the target's hidden features at every position. All three learn the "
           "target's own next-token distribution (the shipped early exit and prophet on the target's own replies: "
           "`python -m decoders.selfdraft train`), and all three stay exact: the target verifies every token. bench/results/self-drafters-smollm2-135m.md compares them.",
           "self_draft", "early-exit-chat.json"),
    Lesson("10. Copying instead of guessing: suffix decoding", "Copying",
           "Much of what a model writes was written before: code it was asked to edit, an answer it gave a minute "
           "ago. **Suffix decoding** drafts without any model: it looks up the last few tokens of the text in a "
           "**suffix tree** over the prompt, the output so far and a store of **earlier outputs**, and drafts a "
           "tree of what followed them there, each branch weighted by how often it did. The draft costs no "
           "forward pass, and its size **follows the match**: a tail of L tokens that occurred before earns up "
           "to L drafts (vLLM's factor 1), so a long match (orange line) buys a long draft (hollow bars) and a "
           "short or missing one costs next to nothing. That is why model-free drafts win on copy-heavy and "
           "repeated work and lose little on free text. This run (SmolLM2-135M) was asked the same edit a second "
           "time: the first answer sat in the store, and from round 4 on each round copied 9 to 12 tokens of it, "
           "64 tokens in 8 target forwards (τ 8.0) where the first run, copying only from the prompt and itself, "
           "needed 22 (τ 2.9). Both equal the baseline token for token (the model did not really add type hints: "
           "a drafter changes the speed, never the text). **Try it** and press **Run** twice: the second run "
           "drafts from your first (the store is yours alone; see *Your earlier outputs*).",
           "suffix", "suffix-code-edit.json"),
    Lesson("11. Training a drafter: acceptance sets the speed", "Training",
           "A learned drafter is only as fast as its guesses are right. SpecLab trains its drafters on the "
           "**target's own replies** (SmolLM2 answering ShareGPT first turns and code requests: "
           "`python -m decoders.training replies`). An **EAGLE head** reads the target's hidden feature at each "
           "position and learns to predict the next feature (a regression loss) and the target's next token (a "
           "classification loss). Training **resumes** where it stopped (`--resume`), and a new head replaces the "
           "shipped one only when it beats it on **held-out** prompts, ones it never trained on, by more than one "
           "standard error (`python -m decoders.training compare`). The chart shows what that buys: **α(k)**, the "
           "share of drafts at depth k the target accepts. Acceptance compounds: a chain of drafts yields "
           "τ = 1 + α1 + α1·α2 + … tokens per target forward, so the paper's head, near 0.75 at every depth, makes "
           "more than three tokens a forward, and a head near 0.5 under two, before the drafts' own cost. That "
           "gap is why EAGLE-2 gains little here: with the shipped head and a tree sized to this CPU's costs it ran "
           "1.26× plain decoding (bench/results/trees-smollm2-135m.md), and the paper's 59-node trees still lose "
           "(Claims tab), where the paper reports 3–4× with heads near 0.8. Published heads train for GPU-hours on "
           "millions of tokens, this one for about two and a half hours on a 2-core CPU on a quarter of a million, and its "
           "curve has nearly flattened there. **Try it** "
           "grows an EAGLE-2 tree from the shipped head.",
           "acceptance", "eagle2-head-chat.json"),
]


def ready(lessons: list[Lesson] = LESSONS) -> list[Lesson]:
    return [lesson for lesson in lessons if not lesson.coming]


def lesson_trace(lesson: Lesson, folder: Path = TRACES) -> Trace | BeamTrace | None:
    """The lesson's recorded run: a chain or tree trace (schema 1), or a beam trace (schema 2, in traces/beams/)."""
    if not lesson.trace:
        return None
    path = folder / lesson.trace
    if lesson.figure == "whisper":
        return WhisperSet.from_json(path.read_text(encoding="utf-8"))
    return load_any(path.read_text(encoding="utf-8")) if lesson.figure == "forest" else read_trace_file(path)


def runs_in_generate(lesson: Lesson) -> bool:
    """"Try it" fills the Generate tab, which runs chain and tree methods; beams and Whisper run on their own tabs."""
    return bool(lesson.trace) and lesson.figure not in ("forest", "whisper")


def lesson_table(lesson: Lesson, folder: Path = TRACES) -> str:
    """HTML shown under the picture ("" for none): a Whisper lesson's transcripts side by side, WER included."""
    if lesson.figure != "whisper" or lesson.coming:
        return ""
    recorded = lesson_trace(lesson, folder)
    first = recorded.traces[0]
    caption = (f"<p><small>Recorded on {html.escape(recorded.clip)} with {html.escape(first.model)} (float32, "
               f"beam size {first.options.get('beam_size')}) on SpecLab's 2-core CPU: the times are that run's. "
               "WER against the LibriVox reference.</small></p>")
    return results_html(recorded.traces, recorded.reference) + caption


def whisper_try_states(lesson: Lesson, folder: Path = TRACES) -> dict[str, dict]:
    """{control: update} for the Whisper tab (audio, example, reference, decoders) that re-runs the recording."""
    from app.tabs.whisper import AUDIO_DIR

    recorded = lesson_trace(lesson, folder)
    audio = AUDIO_DIR / recorded.clip
    if not audio.is_file():
        raise ValueError(f"lesson '{lesson.title}' was recorded on {recorded.clip}, which is not in {AUDIO_DIR}")
    return {"audio": {"value": str(audio)}, "example": {"value": recorded.clip},
            "reference": {"value": recorded.reference}, "decoders": {"value": [t.decoder for t in recorded.traces]}}


BEAM_CONTROLS = ("prompt", "model", "draft", "method", "width", "gamma", "thres", "min_width", "memory",
                 "max_tokens", "seed")  # the Beams tab's controls "try it" fills (app/tabs/beams.py build())


def beams_try_values(lesson: Lesson, folder: Path = TRACES) -> dict:
    """The Beams tab's control values that re-run a beam lesson's recorded trace live (name -> value)."""
    from app.tabs.beams import MEMORY_MODES, SAME_AS_PAIRING

    trace = lesson_trace(lesson, folder)
    if not isinstance(trace, BeamTrace):
        raise ValueError(f"lesson '{lesson.title}' has no recorded beam trace to re-run")
    o = trace.options
    memory = next(label for label, one in MEMORY_MODES.items() if one == bool(o.get("one_input_beam")))
    draft = (trace.models.get("draft") or {}).get("name") or o.get("draft_model") or SAME_AS_PAIRING
    return {"prompt": trace.prompt, "model": o["model"], "draft": draft, "method": o["method"],
            "width": o["width"], "gamma": o["gamma"], "thres": o["thres"], "min_width": o["min_width"],
            "memory": memory, "max_tokens": o["max_new_tokens"], "seed": o["seed"]}


def lesson_figure(lesson: Lesson, folder: Path = TRACES) -> go.Figure:
    """The lesson's picture, drawn from its recorded trace (no model is loaded)."""
    if lesson.coming:
        return empty_figure(f"Coming: {lesson.coming}.")
    return FIGURES[lesson.figure](lesson_trace(lesson, folder))


_OPTION_FIELDS = {f.name for f in fields(DecodeOptions)}


def try_settings(lesson: Lesson, folder: Path = TRACES) -> dict:
    """The example dict (prompt + DecodeOptions suggestions) that re-runs the lesson's trace live."""
    trace = lesson_trace(lesson, folder)
    if trace is None:
        raise ValueError(f"lesson '{lesson.title}' has no recorded trace to re-run; add `trace=` to its entry")
    recorded = {k: v for k, v in (trace.options or {}).items() if k in _OPTION_FIELDS and k in EXAMPLE_CONTROLS}
    return {"prompt": trace.prompt, "suggest": {**recorded, **lesson.settings}}


def try_states(lesson: Lesson, folder: Path = TRACES) -> dict[str, dict]:
    """{control: update} for the Generate tab's EXAMPLE_CONTROLS, as an example click would set them."""
    return example_states(try_settings(lesson, folder))


def tab_label(lesson: Lesson) -> str:
    number = lesson.title.split(".", 1)[0]
    return f"{number} {lesson.tab}" + (" (coming)" if lesson.coming else "")


def lesson_id(number: int) -> str:
    """The lesson's tab id (the contents picker selects the tab by it)."""
    return f"lesson-{number}"


def contents_markdown(lessons: list[Lesson] = LESSONS) -> str:
    lines = [f"- {lesson.title}" + (f" *(coming: {lesson.coming})*" if lesson.coming else "") for lesson in lessons]
    return "**Lessons**\n\n" + "\n".join(lines)


def build(controls: dict, whisper: dict | None = None, beams: dict | None = None) -> None:
    """Lessons as tabs; "try it" fills the Generate tab's controls (`controls`: name -> component), for the
    Whisper lesson the Whisper tab's (`whisper`: the dict whisper_tab.build returns), for the beams lesson the
    Beams tab's (`beams`: the dict beams.build returns)."""
    import gradio as gr

    from app.shared import glossary

    # The contents are a picker, not a list to read: one tap opens the lesson, on a phone too, where only a couple
    # of the eight tab labels fit on the row of tabs.
    picker = gr.Radio([(lesson.title + (" (coming)" if lesson.coming else ""), i) for i, lesson in enumerate(LESSONS)],
                      value=0, label="Lessons (tap one to open it)", elem_id="sl-lesson-list")
    targets = [controls[name] for name in EXAMPLE_CONTROLS]
    with gr.Tabs(elem_id="sl-lessons") as lesson_tabs:
        for number, lesson in enumerate(LESSONS):
            with gr.Tab(tab_label(lesson), id=lesson_id(number)) as lesson_tab:
                lesson_tab.select(lambda n=number: n, None, picker, queue=False, show_progress="hidden")
                gr.Markdown(f"### {lesson.title}\n\n{lesson.text}")
                gr.Plot(lesson_figure(lesson), label=lesson.title)
                table = _whisper_missing(lesson) or lesson_table(lesson)
                if table:
                    gr.HTML(table)
                if lesson.coming:
                    gr.Markdown(f"*Coming: {lesson.coming}.*")
                    continue
                if runs_in_generate(lesson):
                    button = gr.Button("Try it: load these settings into the Generate tab", variant="primary")
                    note = gr.Markdown()
                    states = try_states(lesson)
                    button.click(lambda s=states: (*(gr.update(**s[n]) for n in EXAMPLE_CONTROLS),
                                                   "Loaded: open the **Generate** tab and press **Run**."),
                                 None, [*targets, note], queue=False, show_progress="hidden",
                                 api_name=f"learn_try_{number}")  # named: the Space test drives one
                elif lesson.figure == "whisper" and whisper:
                    _whisper_button(lesson, whisper)
                elif lesson.figure == "forest" and beams:
                    _beams_button(lesson, beams)
    picker.input(lambda n: gr.Tabs(selected=lesson_id(int(n))), picker, lesson_tabs, queue=False,
                 show_progress="hidden")
    with gr.Accordion("Rejection-sampling explainer", open=False):
        explainer.build(with_glossary=False)
    glossary.build()


def _whisper_missing(lesson: Lesson) -> str:
    """For a Whisper lesson on a server without openai-whisper (its WER needs Whisper's normaliser): why the
    transcripts are not shown; "" otherwise."""
    from app.shared.optional import WHISPER, missing, missing_message

    gone = missing(*WHISPER) if lesson.figure == "whisper" else []
    return f"<p><b>Not available here.</b> {html.escape(missing_message(gone, 'This lesson'))}</p>" if gone else ""


def _beams_button(lesson: Lesson, beams: dict) -> None:
    import gradio as gr

    values = beams_try_values(lesson)
    button = gr.Button("Try it: load these settings into the Beams tab", variant="primary")
    note = gr.Markdown()
    button.click(lambda: (*(gr.update(value=values[n]) for n in BEAM_CONTROLS),
                          "Loaded: open the **Beams** tab and press **Run**."),
                 None, [*(beams[n] for n in BEAM_CONTROLS), note], queue=False, show_progress="hidden")


def _whisper_button(lesson: Lesson, whisper: dict) -> None:
    import gradio as gr

    states, names = whisper_try_states(lesson), ("audio", "example", "reference", "decoders")
    button = gr.Button("Try it: load this clip and these decoders into the Whisper tab", variant="primary")
    note = gr.Markdown()
    button.click(lambda: (*(gr.update(**states[n]) for n in names),
                          "Loaded: open the **Whisper** tab and press **Transcribe**."),
                 None, [*(whisper[n] for n in names), note], queue=False, show_progress="hidden")
