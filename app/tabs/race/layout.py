"""The Race tab's layout: method presets, the table, the speed chart, Leviathan's curve and the verdicts."""
from __future__ import annotations

import gradio as gr

from app.shared.boxes import Bounded

from app.figures.race import leviathan_figure, race_table_html, speed_figure
from app.shared import glossary
from app.shared.decode_slot import QUEUE_LIMIT
from app.shared.session import RunSession
from app.shared.wiring import as_tuple, with_specials
from app.shared.hosting import registry_only
from app.tabs.generate.layout import model_choices
from app.tabs.race import runs as race
from app.tabs.race.intro import race_intro


def race_tokens_help() -> str:
    """What the race runs, from the constants it runs with (runs.WARMUP_TOKENS, runs.TIMED_RUNS)."""
    n = race.WARMUP_TOKENS
    article = "an" if str(n).startswith("8") or n in (11, 18) else "a"  # "an 8-token", "a 16-token"
    return (f"Tokens per timed run. Each method (the baseline too) first runs {article} {n}-token warm-up, "
            f"then {race.TIMED_RUNS} timed runs of this length; the table shows the median run and the range.")


def build(c: dict) -> None:
    gr.Markdown(race_intro(), elem_id="sl-race-intro")  # quotes the last measured default race (intro.py)
    with gr.Row(elem_id="sl-race-input"):
        prompt = gr.Textbox(race.DEFAULT_PROMPT, label="Prompt (race)", lines=4, elem_id="sl-race-prompt", scale=3,
                            info="A copy task by default: most of the answer is already in the prompt, which is what "
                                 "prompt lookup drafts from (code edits work the same way).")
        with gr.Column(scale=1, min_width=240):
            model = gr.Dropdown(model_choices(), value=race.DEFAULT_MODEL, label="Target model (race)",
                                elem_id="sl-race-model", allow_custom_value=not registry_only(),
                                info="SmolLM2 races in about a minute here; the Qwen pair takes several.")
            copy = gr.Button("Use the Generate tab's prompt and model", size="sm", elem_id="sl-race-copy")
    copy.click(lambda p, m: (p, m), [c["prompt"], c["model"]], [prompt, model], queue=False, show_progress="hidden")
    with gr.Row(elem_id="sl-race-setup"):  # wraps on a narrow screen (theme.PAGE_CSS)
        methods = gr.CheckboxGroup(list(race.PRESETS), value=race.DEFAULT_METHODS, label="Methods (up to 3)",
                                   elem_id="sl-race-methods",
                                   info="Draft-model methods and draft-model trees need a target with a draft "
                                        "pairing (qwen2.5-coder-1.5b) or a draft model chosen on the Generate tab; "
                                        "EAGLE-head trees need a head for the target (assets/eagle/README.md). "
                                        "cost-aware = each round drafts what this machine verifies profitably (its "
                                        "measured t(n) and the running acceptance; the rule panel on the Generate "
                                        "tab draws each choice). K D M = children per node, depth, draft nodes "
                                        "verified; the papers' K10 D6 M59 assume a GPU.")
        race_tokens = Bounded(8, 256, value=48, step=1, label="max new tokens (race)", elem_id="sl-race-tokens",
                                info=race_tokens_help())
    with gr.Row():
        race_btn = gr.Button("Race", variant="primary", elem_id="sl-race-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="sl-race-stop")
    r = {"race_status": gr.Markdown("", elem_id="sl-race-status"), "race_error": gr.HTML("", elem_id="sl-race-error"),
         "race_table": gr.HTML(race_table_html([]), elem_id="sl-race-table")}
    with gr.Row(elem_id="sl-race-plots"):  # wraps to one plot per line on a narrow screen (theme.PAGE_CSS)
        r["race_speed"] = gr.Plot(speed_figure([]), label="Speed", elem_id="sl-race-speed")
        r["race_curve"] = gr.Plot(leviathan_figure([]), label="Expected vs measured speedup", elem_id="sl-race-curve")
    r["race_verdicts"] = gr.Markdown("", elem_id="sl-race-verdicts")  # one sentence per method (app/tabs/race/verdicts.py)
    costs = race.cost_views(race.DEFAULT_MODEL, "auto")  # this machine's t(n) beside the H100's (curves.py)
    r["race_costs_note"] = gr.Markdown(costs["race_costs_note"], elem_id="sl-race-costs-note")
    r["race_costs"] = gr.Plot(costs["race_costs"], label="Why a method wins on one machine and loses on another",
                              elem_id="sl-race-costs")
    glossary.build()
    to_tuple = as_tuple(race.RACE_OUTPUTS, r)
    inputs = [prompt, model, c["dtype"], c["draft_model"], methods, race_tokens, c["temperature"], c["seed"]]

    session = gr.State(RunSession())  # this tab's race, for Stop (app/shared/session.py); per session, server-side
    n_in = len(inputs)

    def race_fn(*args):  # (inputs..., session, request, progress): see app/shared/wiring.py
        results = race.race(*args[:n_in], progress=args[n_in + 2], session=args[n_in])
        try:
            for result in results:
                yield to_tuple(result)
        finally:  # Gradio closing the job closes the race (and the running method's decoder) with it
            results.close()

    with_specials(race_fn, race.RACE_INPUTS + ("session",))

    def admit_fn(*args):  # the validator runs when Gradio queues the race: Stop can then tell "queued"
        if args[n_in] is not None:
            args[n_in].admit()
        return [gr.validate(True, "") for _ in args[:n_in + 1]]

    # concurrency "decode": a few races wait in the decode slot's line, saying what they wait for (decode_slot.py)
    race_btn.click(race_fn, inputs + [session], [r[n] for n in race.RACE_OUTPUTS], concurrency_limit=QUEUE_LIMIT,
                   concurrency_id="decode", api_name="race", validator=admit_fn)
    stop_btn.click(lambda run_session: to_tuple(race.stop_race(run_session)), [session],
                   [r[n] for n in race.RACE_OUTPUTS], api_name="race_stop")
