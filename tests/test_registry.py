"""The registries are the one list of methods, drafters and rules: the README's "add a drafter" example works
exactly as written, and every consumer (options, API, CLI, app pickers, Race, bench) reads the same tables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from decoders import DecodeOptions, OptionsError, generate, registry
from decoders.drafters import Drafter, DraftStop, Proposal
from decoders.registry import DrafterSpec, Family
from decoders.tree import DraftTree, Flavor

README = Path(__file__).resolve().parent.parent / "decoders" / "README.md"
PROMPT = [10, 11, 12, 12, 12, 12, 10, 11]


class RepeatLastDrafter(Drafter):  # the README's example, line for line (checked below)
    name = "repeat-last"
    offers_distribution = False  # its candidates are chosen, not sampled: q is a point mass

    def propose(self, ids, limit, rule, warp, generator, record):
        tree = DraftTree.root_only(ids[-1])
        tree.flavor = Flavor.DETERMINISTIC
        for _ in range(max(0, limit)):
            tree.add(tree.size - 1, ids[-1])
        return Proposal(tree, reason=DraftStop.LIMIT if limit > 0 else DraftStop.BUDGET)


@pytest.fixture
def repeat_last(monkeypatch):
    spec = DrafterSpec("repeat-last", Family.CHAIN, "repeat last", (), lambda ctx: RepeatLastDrafter(), offers_q=False,
                       help="draft the last token again")
    monkeypatch.setitem(registry.DRAFTERS, "repeat-last", spec)
    return spec


def test_the_readme_example_is_this_file_s_drafter():
    """The class and the registry line in decoders/README.md are the ones this test runs."""
    text = README.read_text()
    source = Path(__file__).read_text()
    block = re.search(r"class RepeatLastDrafter\(Drafter\):\n(.*?)```", text, re.S).group(1)
    assert block.strip() in source
    assert 'DrafterSpec("repeat-last", Family.CHAIN, "repeat last", (), lambda ctx: RepeatLastDrafter(), offers_q=False,' \
        in text


@pytest.mark.parametrize("rule", ["static", "heuristic"])
def test_a_new_drafter_is_one_class_and_one_registry_line(tiny, repeat_last, rule):
    options = DecodeOptions(method="speculative", drafter="repeat-last", rule=rule, gamma=3, max_new_tokens=24)
    trace = generate(options, PROMPT, target=tiny)
    baseline = generate(DecodeOptions(max_new_tokens=24), PROMPT, target=tiny)
    assert trace.output_ids == baseline.output_ids
    assert trace.label == f"speculative · repeat last · {registry.rule(rule).label(options)}"
    assert sum(r.n_drafted for r in trace.rounds) > 0


def test_a_new_drafter_without_q_is_steered_only_by_rules_that_need_none(repeat_last):
    assert repeat_last.rules == ("static", "heuristic")
    with pytest.raises(OptionsError, match="repeat last copies tokens and has none; use rule 'static' or 'heuristic'"):
        DecodeOptions(method="speculative", drafter="repeat-last", rule="adaedl").validate()


def test_the_app_and_the_cli_list_a_new_drafter(repeat_last):
    from app.tabs.generate import controls
    from decoders.__main__ import build_parser

    assert "repeat-last" in controls.drafters_for("smollm2-135m")
    args = build_parser().parse_args(["run", "--prompt", "x", "--method", "speculative", "--drafter", "repeat-last"])
    assert args.drafter == "repeat-last"


def test_uses_draft_model_is_one_predicate():
    def uses(**fields):
        return registry.uses_draft_model(DecodeOptions(**fields))

    assert uses(method="speculative", drafter="draft-model")
    assert uses(method="speculative", drafter="eagle2")
    assert not uses(method="speculative", drafter="eagle2", eagle_head="auto")
    assert uses(method="dsbd", temperature=1.0)
    assert not uses(method="speculative", drafter="prompt-lookup")
    assert not uses(method="beam-sampling", temperature=1.0)
    assert not uses()


def test_tree_shape_defaults_are_the_options_defaults():
    """One place for the papers' values: DecodeOptions (the TreeShape dataclass has none of its own)."""
    d = DecodeOptions()
    eagle2 = registry.tree_shape(DecodeOptions(method="speculative", drafter="eagle2"))
    ddd = registry.tree_shape(DecodeOptions(method="speculative", drafter="ddd"))
    assert (eagle2.k, eagle2.steps, eagle2.m) == (d.tree_k, d.tree_depth, d.tree_m) == (10, 6, 59)
    assert (ddd.checks, ddd.threshold, ddd.steps, ddd.beam) == (d.ddd_checks, d.ddd_x, d.ddd_steps, d.ddd_width)
