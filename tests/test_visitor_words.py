"""Issue 47.8: what a first-time visitor reads, said once and said right (the wording list)."""
from __future__ import annotations

import pytest

from decoders import registry
from decoders.options import DecodeOptions, OptionsError


def test_the_drafter_help_names_only_the_drafters_offered():
    """Early exit and prophet are offered only where their weights are trained; the help named them everywhere."""
    from app.tabs.generate.controls import SELF_DRAFTERS, control_states, drafters_for

    for model in ("smollm2-135m", "qwen2.5-coder-1.5b", "gemma3-270m"):
        states = control_states(model, "speculative", "prompt-lookup", "static", 0.0, None)
        offered = drafters_for(model)
        assert states["drafter"]["choices"] == offered
        for name in registry.DRAFTERS:
            assert (f"{name}: " in states["drafter"]["info"]) == (name in offered), (model, name)
    assert any(name not in drafters_for(m) for m in ("smollm2-135m", "gemma3-270m") for name in SELF_DRAFTERS), \
        "no target without a self-drafter: the test would not see one left out"


def test_a_stopped_race_says_its_row_for_one_method_and_their_rows_for_more():
    from app.tabs.race.runs import _stopped_line

    runs = [DecodeOptions(), DecodeOptions(method="speculative", drafter="prompt-lookup"),
            DecodeOptions(method="speculative", drafter="prompt-lookup", rule="adaedl")]
    one = _stopped_line(runs, ["baseline"], None)
    assert "the baseline finished (its row stays in the table)" in one and "their rows" not in one
    assert "(their rows stay in the table)" in _stopped_line(runs, ["baseline", "run"], None)


def test_too_many_batch_prompts_counts_the_lines_to_remove_in_words():
    from app.tabs.batch.handlers import MAX_BATCH, parse_prompts

    with pytest.raises(OptionsError, match=r"remove 1 line$"):
        parse_prompts("\n".join(f"prompt {i}" for i in range(MAX_BATCH + 1)))
    with pytest.raises(OptionsError, match=r"remove 2 lines$"):
        parse_prompts("\n".join(f"prompt {i}" for i in range(MAX_BATCH + 2)))


def test_the_cost_plot_names_its_machine_when_it_draws_one_curve():
    """With this machine's curve not measured yet, the H100's was drawn alone, and plotly hides a one-trace legend: the
    note said "not measured yet" beside a curve that named no machine."""
    from app.figures.race import cost_curves_figure, cost_curves_note
    from app.tabs.race.curves import measured_elsewhere

    elsewhere = measured_elsewhere()
    assert elsewhere is not None, "bench/results holds the H100 curve the Race draws"
    fig = cost_curves_figure(None, elsewhere)
    assert len(fig.data) == 1 and fig.layout.showlegend is True
    assert "measured elsewhere" in fig.data[0].name
    assert "not measured yet" in cost_curves_note(None, elsewhere)
