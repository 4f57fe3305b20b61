"""The Generate tab's layout and events: prompt and Run, the streamed result, the options, traces in and out.

Handlers live in handlers.py (UI values -> DecodeOptions -> rounds -> views); controls.py says which controls apply.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr

from app.shared.boxes import SCRUB, Bounded, Choice, ChoiceDropdown, Scrubber

from decoders import registry
from decoders.options import DRAFTERS, MAX_NEW_TOKENS_LIMIT, RULES, TREE_DRAFTERS

from app.shared.words import counted
from app.shared.decode_slot import QUEUE_LIMIT
from app.shared import glossary
from app.shared.hosting import registry_only
from app.shared.paths import ASSETS
from app.shared.session import RunSession
from app.shared.theme import PROVENANCE_COLORS
from app.tabs.race.load import is_busy, load_words
from app.shared.wiring import as_tuple, with_specials
from app.figures.text import legend_html
from app.tabs.generate import handlers
from app.tabs.generate.controls import DEPENDENT, dtype_choices, EXAMPLE_CONTROLS, OPENING, OPENING_BASELINE, \
    TREE_SOURCES, control_states, draft_choices, example_states, lam_for, opening_value
from app.tabs.generate.views import OUTPUTS, ROUND_OUTPUTS, full_views, opening_trace, read_trace_file, \
    recorded_traces, shown_round

FALLBACK_MODELS = [("smollm2-135m", "single"), ("qwen2.5-coder-1.5b", "target"), ("qwen2.5-coder-0.5b", "draft"),
                   ("gemma3-270m", "single")]


def model_choices() -> list[tuple[str, str]]:
    """(label, name) pairs from the registry; a fixed list when decoders/runtime/models.py is not importable."""
    try:
        from decoders.runtime.models import describe_models

        rows = describe_models()
        return [(f"{r['name']} · {r['role']}" + ("" if r.get("installed", True) else " (hub download)"), r["name"])
                for r in rows]
    except Exception:
        return [(f"{name} · {role}", name) for name, role in FALLBACK_MODELS]


def example_prompts() -> list[dict]:
    try:
        return json.loads((ASSETS / "prompts.json").read_text(encoding="utf-8"))["prompts"]
    except (OSError, ValueError, KeyError):
        return []


RECORDED_LABEL = "Recorded runs"


def opening_status(trace, baseline=None) -> str:
    """What the opening view is and what Run does, in two short lines on a phone (the result follows right after):
    the recording's settings are the controls' (controls.OPENING), so Run repeats it live. The stats name the rest.
    With the baseline recorded beside it, the line also shows the speed-up: what "faster" means, at first sight."""
    options = trace.options or {}
    what = f"{options.get('model', '?')}, {options.get('dtype', '?')}, {counted(options.get('max_new_tokens', '?'), 'new token')}"
    speed = opening_speed(trace, baseline) if baseline is not None else ""
    if speed:
        return f"{speed}: {what}{time_split(trace)}. **Run** repeats it live."
    return f"Recorded run: {what}. **Run** repeats it live."


def time_split(trace) -> str:
    """'; τ 3.4, 99% verifying' (and 'N% drafting' where drafting took 1% or more): where the speed-up came from, or
    went, with what each share means on hover; '' when the recording has no time split."""
    totals = trace.totals or {}
    seconds = totals.get("seconds") or {}
    spent = sum(seconds.values())
    if not spent or not totals.get("tau"):
        return ""
    verify, draft = seconds.get("verify", 0.0) / spent, seconds.get("draft", 0.0) / spent
    tip = html.escape(f"of the decode time: {verify:.1%} in the target's verification forwards, {draft:.1%} drafting, "
                      f"the rest bookkeeping; τ = {totals['tau']:.2f} tokens per target forward", quote=True)
    shares = f"{verify:.0%} verifying" + (f", {draft:.0%} drafting" if draft >= 0.01 else "")
    return f'; τ {totals["tau"]:.1f}, <span title="{tip}" style="text-decoration: underline dotted">{shares}</span>'


def opening_speed(trace, baseline) -> str:
    """'Recorded on AMD EPYC 7B13, 2 cores at **2.10 tokens/s, 2.31× the baseline's 0.91**' ('' when a speed is
    missing). The machine is the one both recordings name (bench/record_opening.py records them together)."""
    fast, slow = (trace.totals or {}).get("tokens_per_second"), (baseline.totals or {}).get("tokens_per_second")
    if not fast or not slow:
        return ""
    recorded = [(t.totals or {}).get("recorded") or {} for t in (trace, baseline)]
    machines = {r.get("machine") for r in recorded}
    machine = machines.pop() if len(machines) == 1 else None
    where = f" on {', '.join(machine.split(', ')[:2])}" if machine else ""
    busy = [r["load"] for r in recorded if is_busy(r.get("load"))]
    if busy and machine:  # said from the load measured while each was recorded (app/tabs/race/load.py)
        worst = max(busy, key=lambda load: load.get("others_cores") or 0.0)
        tip = html.escape(f"measured while recording: {load_words(worst)}", quote=True)
        where += f' (<span title="{tip}" style="text-decoration: underline dotted; cursor: help">busy</span>)'
    return f"Recorded{where} at **{fast:.2f} tokens/s, {fast / slow:.2f}× the baseline's {slow:.2f}**"


def _opening_baseline(opening: Path):
    """The baseline recorded beside the opening run (None when it is missing or unreadable: no speed-up is shown)."""
    try:
        return read_trace_file(opening.with_name(OPENING_BASELINE))
    except Exception:
        return None


def _prompt_controls(opening_prompt: str) -> dict:
    """The prompt and Run / Stop: the top of the page, followed by the result on a narrow screen."""
    c = {}
    c["prompt"] = gr.Textbox(label="Prompt", lines=4, elem_id="sl-prompt", value=opening_prompt,
                             info="The model sees it through its chat template "
                             "(untick 'chat template' under Sampling for raw continuation).")
    with gr.Row(elem_id="sl-run-row"):
        c["run_btn"] = gr.Button("Run", variant="primary", elem_id="sl-run")
        c["stop_btn"] = gr.Button("Stop", variant="stop", elem_id="sl-stop")
    return c


def _opening_prompt(trace) -> str:
    """The prompt of the recorded run the page opens on (Run repeats it live), else the first example's."""
    if trace is not None and getattr(trace, "prompt", None):
        return trace.prompt
    examples = example_prompts()
    return examples[0]["prompt"] if examples else ""


def _controls() -> dict:
    """The Generate controls, starting on controls.OPENING (the opening recorded run's method, else defaults)."""
    d = OPENING
    shown = control_states(d.model, d.method, d.drafter, d.rule, d.temperature, opening_value("draft_model"),
                           controller=d.controller)
    c = {}
    c["model"] = gr.Dropdown(model_choices(), value=d.model, label="Target model", elem_id="sl-model",
                             allow_custom_value=not registry_only(),
                             info="The model whose output must not change. Loads on first use (seconds, with "
                                  "progress); cached afterwards. On 2 CPU cores (this project's machine, a CPU "
                                  "Space) SmolLM2 decodes about 15 tokens/s, the Qwen2.5-Coder 1.5B target about 3.")
    c["dtype"] = gr.Radio(dtype_choices(d.model), value=d.dtype, label="Number format (dtype)",
                          elem_id="sl-dtype",
                          info="auto = float32 on every machine: greedy output equals the baseline token for token "
                               "(a near-tie can still flip: the Race says which). bfloat16 is an explicit choice: "
                               "faster on some machines (measured here once timed), and it may differ from the "
                               "baseline by rounding.")
    c["method"] = gr.Radio(["baseline", "speculative"], value=d.method, label="Method",
                           info="baseline: one target forward per token. speculative: draft, then verify.")
    with gr.Accordion("Speculation", open=True):
        # Built with every choice, narrowed on page load (_wire_dependent_controls): Gradio checks an API call's
        # values against the choices a component was built with, so narrow ones would refuse valid API runs.
        c["drafter"] = Choice(list(DRAFTERS + TREE_DRAFTERS), value=d.drafter, label="Drafter",
                                elem_id="sl-drafter", info=shown["drafter"]["info"])
        c["eagle_head"] = Choice([(label, value) for value, label in TREE_SOURCES], value=opening_value("eagle_head"),
                                   label="Tree grown by", elem_id="sl-tree-source",
                                   info="The draft model of the pair, or an EAGLE head: one decoder layer reading "
                                        "the target's own features (assets/eagle/README.md says how it was trained "
                                        "and how well it drafts).")
        c["draft_model"] = ChoiceDropdown(draft_choices(d.model), value=shown["draft_model"]["value"],
                                       label="Draft model", allow_custom_value=not registry_only(),
                                       info="For the draft-model and tree drafters it must share the target's "
                                            "vocabulary (qwen2.5-coder-1.5b pairs with qwen2.5-coder-0.5b); the "
                                            "cross-tokenizer drafter takes another tokenizer (smollm2-135m).")
        c["rule"] = Choice(list(RULES), value=d.rule, elem_id="sl-rule", label="Draft-length rule",
                             info=_registry_help(registry.RULES) + ". AdaEDL and max-confidence start from their own "
                                  "λ and adapt it to the running acceptance.")
        c["controller"] = gr.Radio([("the rule's own (γ, L_max)", "off"), ("cost-aware: what this machine verifies "
                                                                             "profitably", "cost")],
                                   value=d.controller, label="Draft length cap", elem_id="sl-controller",
                                   info="cost-aware: each round the cap maximises expected tokens per second from "
                                        "this machine's measured verification cost t(n) and the running acceptance "
                                        "by depth (a tree: how far to grow and how many nodes to send; suffix "
                                        "decoding: how much of its copied tree to send, none when the plain step "
                                        "wins, its counts calibrated by match length); AdaEDL's or max-confidence's "
                                        "stop inside it stands only if drafting on does not pay; past it a round "
                                        "drafts on while the rule is sure and it pays (drawn in the rule panel).")
        c["gamma"] = Bounded(1, 16, value=d.gamma, step=1, label="γ (draft length)",
                               info="static: tokens per round; heuristic: starting length; prompt lookup: tokens "
                                    "copied per match.")
        c["max_draft"] = Bounded(1, 16, value=d.max_draft, step=1, label="max draft (L_max)",
                                   info="Cap on drafted tokens per round for heuristic, max-confidence and AdaEDL.")
        c["lam"] = Bounded(0.0, 1.0, value=opening_value("lam"), step=0.01, label="initial λ",
                             info="Stop threshold at the start; choosing a rule sets its own starting λ "
                                  "(AdaEDL 0.5, max-confidence 0.4). It then moves with the running acceptance.")
        c["ngram"] = Bounded(1, 8, value=d.ngram, step=1, label="n-gram (prompt lookup)",
                               info="Longest tail n-gram to look up in the text so far (tries n, n−1, …, 1).")
        c["skip_layers"] = gr.Textbox(label="Layers to skip (layer-skip)", placeholder="e.g. 9,11,13",
                                      info="Comma-separated layer indices; blank = every odd layer in the middle "
                                           "of the stack. Layer 0 always runs.")
        c.update(_tree_controls(d))
    with gr.Accordion("Sampling and length", open=False):
        # A number box, not a slider: a slider silently clamps what is typed (0 ran 1 token, 100000 ran 512); the
        # options' validation says what is wrong instead (decoders/options.py).
        # precision=None: the handler sees what was typed and refuses 2.5 or an empty box (app/shared/numbers.py)
        c["max_new_tokens"] = gr.Number(value=d.max_new_tokens, precision=None, label="max new tokens",
                                        elem_id="sl-max-tokens",
                                        info=f"Stop after this many generated tokens: 1 to {MAX_NEW_TOKENS_LIMIT}, "
                                             "and prompt + this must fit the model's context.")
        c["temperature"] = Bounded(0.0, 2.0, value=d.temperature, step=0.05, label="temperature",
                                     info="0 = greedy (accept a draft iff it is the target's argmax); above 0, "
                                          "rejection sampling keeps the target's distribution exactly.")
        c["top_k"] = Bounded(0, 100, value=d.top_k, step=1, label="top-k",
                               info="Keep only the k most likely tokens (0 = off). Applied to draft and target.")
        c["top_p"] = Bounded(0.05, 1.0, value=d.top_p, step=0.05, label="top-p",
                               info="Keep the smallest set of tokens with this much probability (1 = off).")
        c["seed"] = gr.Number(value=d.seed, precision=None, label="seed",
                              info="Seeds every random draw (sampling and the acceptance tests): same seed, "
                                   "same run.")
        c["chat"] = gr.Checkbox(value=d.chat, label="chat template",
                                info="Wrap the prompt in the model's chat template.")
        c["live"] = gr.Checkbox(value=True, label="stream every round",  # display only, not a DecodeOptions field
                                info="Draw while decoding (a few updates per second). Untick for cleaner "
                                     "timings: drawing happens inside the timed loop.")
    for name in DEPENDENT:  # hide what does not apply to the opening method
        c[name].visible = shown[name]["visible"]
    return c


def _registry_help(table: dict) -> str:
    """One line per choice, from the registry's own help (decoders/registry.py), so a new drafter explains itself."""
    return ". ".join(f"{name}: {spec.help}" for name, spec in table.items())


def _tree_controls(d) -> dict:
    """EAGLE-2's K, D, M and DDD's S, x, n, w; the defaults are the papers' (decoders/options.py says which)."""
    c = {}
    c["tree_k"] = Bounded(1, 20, value=d.tree_k, step=1, label="K (children per expanded node)",
                            info="Each expanded node adds its K most likely next tokens to the pool. "
                                 "EAGLE-2 paper: 10.")
    c["tree_depth"] = Bounded(1, 12, value=d.tree_depth, step=1, label="D (expansion steps, EAGLE-2)",
                                info="How many times the frontier grows: the deepest draft. EAGLE-2 paper: 6.")
    c["tree_m"] = Bounded(1, 128, value=d.tree_m, step=1, label="M (draft nodes sent to the target)",
                            info="The pool's M most valuable nodes (value = product of draft probabilities on the "
                                 "path) are verified in one forward. EAGLE-2 paper: 60 tokens with the root.")
    c["ddd_checks"] = gr.Textbox(value=",".join(str(s) for s in d.ddd_checks), label="S (DDD: steps that check)",
                                 info="Expansion steps where DDD checks its confidence H. DDD paper: 5,7,9.")
    c["ddd_x"] = Bounded(-3.0, 0.0, value=d.ddd_x, step=0.05, label="x (DDD: stop threshold)",
                           info="Stop growing when H = logsumexp of the frontier's log-values < x. DDD paper: −0.3.")
    c["ddd_steps"] = Bounded(1, 16, value=d.ddd_steps, step=1, label="n (DDD: most expansion steps)",
                               info="Growth stops after n steps even when confident. DDD paper: 11.")
    c["ddd_width"] = Bounded(1, 20, value=d.ddd_width, step=1, label="w (DDD: frontier width)",
                               info="Frontier nodes expanded per step. DDD paper: 10.")
    c.update(_suffix_controls(d))
    return c


def _suffix_controls(d) -> dict:
    """Suffix decoding's knobs (vLLM's names and defaults; decoders/options.py)."""
    c = {}
    c["suffix_factor"] = Bounded(0.25, 4.0, value=d.suffix_factor, step=0.25, label="factor (suffix: drafts per "
                                   "matched token)", info="A matched tail of L tokens earns at most floor(factor × L) "
                                   "drafts: a long match is trusted with a long draft. vLLM: 1; SpecLab: 2 (chosen "
                                   "on this CPU: bench/results/suffix-tune-smollm2-135m.md).")
    c["suffix_min_prob"] = Bounded(0.0, 1.0, value=d.suffix_min_prob, step=0.05, label="min probability (suffix)",
                                     info="A continuation is drafted only if the counts estimate its probability at "
                                          "this or more (how often it followed ÷ how often its parent occurred, "
                                          "multiplied down the path). vLLM: 0.1.")
    c["suffix_tokens"] = Bounded(1, 64, value=d.suffix_tokens, step=1, label="most drafts per round (suffix)",
                                   info="The tree's size cap whatever the match: verifying n tokens costs more than "
                                        "one on a CPU. vLLM: 32 on a GPU; SpecLab: 16.")
    c["suffix_depth"] = Bounded(2, 64, value=d.suffix_depth, step=1, label="suffix tree depth",
                                  info="Longest matched tail plus what follows it that the suffix tree keeps. vLLM: 24.")
    return c


def _outputs(initial: dict) -> dict:
    o = {}
    o["status"] = gr.Markdown(initial.get("status", ""), elem_id="sl-status")
    o["error"] = gr.HTML(initial.get("error", ""), elem_id="sl-error")
    o["text"] = gr.HighlightedText(initial.get("text"), label="Output, coloured by where each token came from "
                                   "(click a token to see its round)", color_map=PROVENANCE_COLORS,
                                   show_legend=False, show_inline_category=False, combine_adjacent=False,
                                   elem_id="sl-text", interactive=False)
    o["legend"] = gr.HTML(initial.get("legend", legend_html()), elem_id="sl-legend")
    trace = initial.get("state")
    n_rounds = len(trace.rounds) if trace is not None else 1
    o["slider"] = Scrubber(1, max(n_rounds, 2), value=shown_round(trace) + 1 if trace is not None else 1, step=1, elem_classes=SCRUB,
                            label="Round", elem_id="sl-round",
                            info="Scrub through the rounds: the tree and the rule panel redraw that round.")
    o["tree"] = gr.Plot(initial.get("tree"), label="Draft tree of the round (drag to pan; zoom with the plot's toolbar)",
                        elem_id="sl-tree")
    o["retokenized"] = gr.Plot(label="The draft's own tokens and the target's tokens they became (cross-tokenizer "
                               "draft; hover a box)", elem_id="sl-retokenized", visible=False)
    with gr.Row(elem_id="sl-rule-row"):  # wraps to one plot per line on a narrow screen (theme.PAGE_CSS)
        o["positions"] = gr.Plot(initial.get("positions"), label="This round: why drafting stopped (rule or tree growth)",
                                  elem_id="sl-positions")
        o["rounds"] = gr.Plot(initial.get("rounds"), label="Over the run: draft length, or tree calibration",
                               elem_id="sl-rounds")
    o["stats"] = gr.HTML(initial.get("stats", ""), elem_id="sl-stats")
    o["stats_plot"] = gr.Plot(initial.get("stats_plot"), label="Acceptance and time", elem_id="sl-stats-plot")
    o["self_draft"] = gr.Plot(label="Where the draft exits the target (early exit / prophet)", elem_id="sl-self-draft",
                              visible=False)
    return o


def build(demo: gr.Blocks) -> dict:
    """The tab's content (call inside `with gr.Tab("Generate")`); returns its controls for the Race and the lessons."""
    recorded = recorded_traces(ASSETS / "traces")
    opening = opening_trace(recorded)
    first = recorded.get(opening)
    initial, first_trace = {}, None
    if first is not None:
        first_trace = read_trace_file(first)
        initial = full_views(first_trace, status=opening_status(first_trace, _opening_baseline(first)))
    with gr.Row(elem_id="sl-main"):  # a grid: prompt and Run, the result, the options (theme.PAGE_CSS)
        with gr.Column(scale=1, min_width=320, elem_id="sl-run-col"):
            c = _prompt_controls(_opening_prompt(first_trace))
        # the examples' cell, filled once every control they set exists
        examples_box = gr.Column(scale=1, min_width=320, elem_id="sl-examples")
        with gr.Column(scale=2, elem_id="sl-outputs"):
            o = _outputs(initial)
        with gr.Column(scale=1, min_width=320, elem_id="sl-options"):
            c.update(_controls())
            with gr.Accordion("Your earlier outputs (suffix decoding copies from them)", open=False,
                              elem_id="sl-store-box"):
                store_box = gr.HTML(handlers.store_html(None), elem_id="sl-store")
                clear_store = gr.Button("Clear the store", size="sm", elem_id="sl-store-clear")
            with gr.Accordion("Traces: recorded, upload, download", open=True):
                c["recorded"] = gr.Dropdown(list(recorded), value=opening,
                                            label=RECORDED_LABEL, elem_id="sl-recorded",
                                            info="Made with the real models on this project's 2-core CPU; replayed "
                                                 "without a model. Each run's settings are in its file.")
                c["upload"] = gr.File(label="Load a trace JSON (max 20 MB)", file_types=[".json"],
                                      type="filepath", elem_id="sl-upload")
                download = gr.DownloadButton("Download this trace (JSON)", value=str(first) if first else None,
                                             elem_id="sl-download")
            glossary.build()  # τ, α, c, λ, γ, t(n): tap to open (app/shared/glossary.py)
    examples = example_prompts()
    if examples:
        with examples_box:
            _examples(examples, c)
    state = gr.State(first_trace)
    session = gr.State(RunSession())  # this tab's runs, for Stop (app/shared/session.py); per session, server-side
    outs = {**o, "state": state, "download": download, "store": store_box}
    out_list = [outs[n] for n in OUTPUTS]
    to_tuple = as_tuple(OUTPUTS, outs)
    inputs = [c[n] for n in handlers.RUN_INPUTS]

    n_in = len(handlers.RUN_INPUTS)

    def run_fn(*args):  # (controls..., session, request, progress): see app/shared/wiring.py
        values, run_session, progress = args[:n_in], args[n_in], args[n_in + 2]
        results = handlers.run(*values, progress=progress, session=run_session)
        try:
            for result in results:
                yield to_tuple(result)
        finally:  # Gradio's cancel closes run_fn; close the run (and the decoder) with it, now
            results.close()

    with_specials(run_fn, handlers.RUN_INPUTS + ("session",))

    def admit_fn(*args):  # the validator runs when Gradio queues the run: Stop can then tell "queued"
        handlers.admit(args[n_in])
        return [gr.validate(True, "") for _ in args[:n_in + 1]]

    def stop_fn(trace, run_session):
        return to_tuple(handlers.stop(trace, run_session))

    # concurrency "decode": one decode at a time is the decode slot's job; up to QUEUE_LIMIT runs wait in its line,
    # each saying what it waits for (app/shared/decode_slot.py says why).
    c["run_btn"].click(run_fn, inputs + [session], out_list, concurrency_limit=QUEUE_LIMIT,
                       concurrency_id="decode", api_name="run", validator=admit_fn)
    # The box names what is shown: once a live run replaces the recording, it no longer names the recording.
    c["run_btn"].click(lambda: gr.update(value=None, label=f"{RECORDED_LABEL} (now showing your live run)"), None,
                       c["recorded"], queue=False, show_progress="hidden", api_name=False)
    c["upload"].upload(lambda: gr.update(value=None, label=f"{RECORDED_LABEL} (now showing your uploaded file)"),
                       None, c["recorded"], queue=False, show_progress="hidden", api_name=False)
    # The one cancel path is the session (app/shared/session.py): no `cancels=[run]`, which the page never sends in
    # Gradio 6.31 (an API client's own job.cancel() needs no listener here).
    c["stop_btn"].click(stop_fn, [state, session], out_list, api_name="stop")
    clear_store.click(handlers.clear_store, [session], store_box, api_name="clear_store")
    round_list = [outs[n] for n in ROUND_OUTPUTS]
    round_tuple = as_tuple(ROUND_OUTPUTS, outs)

    def round_fn(tr, value):  # one render per slider move, spread over the four round views
        return round_tuple(handlers.show_round(tr, value))

    o["slider"].input(round_fn, [state, o["slider"]], round_list, trigger_mode="always_last", api_name="show_round")
    sel_names = ROUND_OUTPUTS + ("slider",)
    sel_tuple = as_tuple(sel_names, outs)

    def select_fn(tr, evt: gr.SelectData):
        return sel_tuple(handlers.select_token(tr, evt))

    o["text"].select(select_fn, [state], [outs[n] for n in sel_names], api_name="select_token")
    c["upload"].upload(lambda p: to_tuple(handlers.load_trace(p)), [c["upload"]], out_list, api_name="load_trace")
    c["recorded"].input(lambda name: to_tuple(handlers.load_trace(recorded.get(name), "recorded")),
                        [c["recorded"]], out_list, api_name="load_recorded")
    c["recorded"].input(lambda: gr.update(label=RECORDED_LABEL), None, c["recorded"], queue=False,
                        show_progress="hidden", api_name=False)
    _wire_dependent_controls(c, demo)
    return c


def _examples(examples: list[dict], c: dict) -> None:
    """Example prompts; a click sets every control the example needs, with the choices that admit its values."""
    picker = gr.Dataset(components=[c["prompt"]], samples=[[e["prompt"]] for e in examples], type="index",
                        sample_labels=[f"{e['kind']}: {e['title']}" for e in examples], label="Example prompts",
                        elem_id="sl-example-list")

    def apply(index):
        states = example_states(examples[int(index)])
        return tuple(gr.update(**states[name]) for name in EXAMPLE_CONTROLS)

    picker.click(apply, [picker], [c[n] for n in EXAMPLE_CONTROLS], queue=False, show_progress="hidden")


def _wire_dependent_controls(c: dict, demo: gr.Blocks) -> None:
    """Choices and visibility follow model, method, drafter, rule and temperature (app/tabs/generate/controls.py), from page load
    on; the λ slider follows the rule.

    Only a visitor's own edits (`.input`) re-adjust. Examples and lessons set every control at once with its choices
    (controls.example_states); a `.change` handler would fire once per control they set, some while the others
    still held their old values, and a late reply computed from that mix undid the example (seen in CI)."""
    deciding = [c[n] for n in ("model", "method", "drafter", "rule", "temperature", "draft_model", "eagle_head",
                               "controller")]

    def adjust(model, method, drafter, rule, temperature, draft_model, eagle_head, controller):
        states = control_states(model, method, drafter, rule, temperature, draft_model, eagle_head, controller)
        return tuple(gr.update(**states[name]) for name in DEPENDENT)

    demo.load(adjust, deciding, [c[n] for n in DEPENDENT], queue=False, show_progress="hidden")
    for name in ("model", "method", "drafter", "rule", "temperature", "eagle_head", "controller"):
        c[name].input(adjust, deciding, [c[n] for n in DEPENDENT], queue=False, show_progress="hidden")
    c["rule"].input(lambda rule: gr.skip() if lam_for(rule) is None else lam_for(rule), [c["rule"]], [c["lam"]],
                    queue=False, show_progress="hidden")


