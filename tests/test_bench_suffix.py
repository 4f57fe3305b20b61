"""bench/suffix.py on a tiny model: the multi-turn set is built from HumanEval without overlap, each later turn's
store holds exactly its chain's earlier answers, every arm equals the baseline, and the tables and targets read."""
from __future__ import annotations

import pytest

from bench import suffix
from bench.runner import Prompt

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_multi_turn_chains_are_new_problems_in_a_fixed_draw():
    chains, provenance = suffix.multi_turn_chains(3)
    again, _ = suffix.multi_turn_chains(3)
    assert [[p.text for p in c] for c in chains] == [[p.text for p in c] for c in again]  # deterministic
    assert len(chains) == 3 and all(len(c) == len(suffix.TURNS) for c in chains)
    assert len(set(provenance["task_ids"])) == 3
    for chain, task in zip(chains, provenance["task_ids"]):
        assert all(p.kind == suffix.MULTI_TURN for p in chain)
        assert all(task.split("/")[1] in p.id for p in chain)
        assert "type hints" in chain[1].text and "comment" in chain[2].text


def test_the_arms_run_equal_the_baseline_and_the_targets_read():
    from tiny import tiny_llama

    target = tiny_llama(layers=4)  # its own model: the bench packs the models it runs
    chain = [Prompt(f"turn{t + 1}-x", suffix.MULTI_TURN, "", [3, 9, 4, 1, 7, t]) for t in range(3)]
    prompts = [Prompt("a", "chat", "", [3, 9, 4, 1, 7]), Prompt("b", "code-editing", "", [10, 11, 12, 10, 11])]
    records, tables = suffix.run({"target": target}, prompts, [chain], reps=1, max_new_tokens=12,
                                 log=lambda *a: None)
    assert chain[0].store is None and [len(p.store.outputs) for p in chain[1:]] == [1, 2]  # earlier turns only
    first_answer = chain[1].store.outputs[0][0]
    assert len(first_answer) == 12 and chain[2].store.outputs[0][0] == first_answer  # turn 1's answer, in both
    assert chain[2].store.outputs[1][0] == tuple(next(r["output_ids"] for r in records if r["prompt"] == "turn2-x"
                                                      and r["method"] == "ours/baseline"))  # turn 2's, in turn 3's
    assert all(r["identical_to_baseline"] for r in records)
    assert set(tables) == {"chat", "code-editing", suffix.MULTI_TURN}
    assert {r["method"] for r in tables["chat"]} == {m.key for m in suffix.methods()}
    assert {r["prompt"] for r in records} == {"a", "b", "turn2-x", "turn3-x"}  # a chain's first turn is not scored
    result = {"settings": {"target": "tiny", "dtype": "float32", "per_kind": 1, "chains": 1, "reps": 1,
                           "max_new_tokens": 12, "threads": 1, "machine": "test", "command": "x", "minutes": 0.0},
              "tables": tables, "identical": "all", "verdicts": suffix.verdicts(tables)}
    assert [(v["arm"], v["kind"]) for v in result["verdicts"]] == [
        (arm, kind) for arm in (suffix.HEADLINE, "ours/suffix") for kind in ("code-editing", suffix.MULTI_TURN, "chat")]
    text = suffix.markdown(result)
    assert text.count("## ") == 4 and "suffix decoding ÷ the better prompt lookup" in text


def test_the_verdict_is_against_the_better_prompt_lookup():
    tables = {"chat": [{"method": "ours/suffix", "label": "s", "over_prompt_lookup": {"ours/prompt-lookup": 1.3,
                                                                                   "ours/prompt-lookup-cost": 0.9}}]}
    assert suffix.verdicts(tables) == [{"arm": "ours/suffix", "label": "s", "kind": "chat", "goal": 0.95, "ratio": 0.9,
                                        "met": False}]


def test_the_vllm_style_ngram_arm_matches_only_tails_of_its_lengths(tiny):
    """vLLM's n-gram proposer: the longest tail of min..max tokens that occurred, its first occurrence, k after it;
    here prompt lookup with ngram_min (a 2-token tail is no match for n 3-5), and lossless like any prompt lookup."""
    from decoders import DecodeOptions, OptionsError, generate
    from decoders.drafters.prompt_lookup import lookup

    ids = [1, 2, 9, 8, 7, 1, 2, 5, 6, 1, 2]
    assert lookup(ids, 5, 4) == [9, 8, 7, 1] and lookup(ids, 5, 4, min_ngram=3) == []
    assert lookup([4, 1, 2, 3, 0, 4, 1, 2, 3], 5, 2, min_ngram=3) == [0, 4]  # "4 1 2 3" matched, first occurrence
    arm = next(m for m in suffix.methods() if m.key == "ours/ngram-vllm")
    options = DecodeOptions(max_new_tokens=20, **arm.options)
    assert (options.ngram_min, options.ngram, options.gamma) == (3, 5, 5)
    prompt = [3, 9, 4, 1, 7, 22, 5, 3, 9, 4, 1, 7]
    assert generate(options, prompt, target=tiny).output_ids == \
        generate(DecodeOptions(max_new_tokens=20), prompt, target=tiny).output_ids
    with pytest.raises(OptionsError, match="ngram_min must be a whole number from 1 to 3"):
        DecodeOptions(method="speculative", drafter="prompt-lookup", ngram=3, ngram_min=4).validate()


@pytest.mark.parametrize("fields", [dict(drafter="suffix"), dict(drafter="suffix", suffix_factor=3.0),
                                    dict(drafter="prompt-lookup", gamma=4)])
def test_the_tuning_replay_makes_the_rounds_the_real_run_makes(tiny, fields):
    """--tune prices drafts without the model: its replay along the greedy output must take the same rounds as a
    real greedy run with the same options (same drafts, same accepted lengths)."""
    from decoders import DecodeOptions, SuffixStore, generate

    prompt = [3, 9, 4, 1, 7, 22, 5, 3, 9, 4, 1, 7]
    options = DecodeOptions(method="speculative", max_new_tokens=40, **fields)
    store = SuffixStore()
    store.add(generate(DecodeOptions(max_new_tokens=30), prompt, target=tiny).output_ids[5:])
    real = generate(options, prompt, target=tiny, store=store)
    replayed = suffix.replay(options, tiny, prompt, real.output_ids, lambda n, tree: float(n), store)
    assert replayed["tau"] == len(real.output_ids) / len(real.rounds)
    assert replayed["est_speedup"] == len(real.output_ids) / sum(r.n_drafted + 1 for r in real.rounds)


def test_tuning_picks_the_factor_with_the_best_estimate(tiny):
    from bench.runner import Prompt

    prompts = [Prompt("t-edit", "code-editing", "", [3, 9, 4, 1, 7, 22, 5, 3, 9, 4, 1, 7]),
               Prompt("t-chat", "chat", "", [5, 8, 2])]
    result = suffix.tune(tiny, prompts, 16, lambda n, tree: 1.0 + 0.1 * (n - 1))
    suffix_arms = [k for k in result["overall"] if k.startswith("ours/suffix-f")]
    assert len(suffix_arms) == len(suffix.TUNE_FACTORS) and "ours/prompt-lookup" in result["estimates"]
    assert len([k for k in result["overall"] if k.startswith("ours/suffix-cost-f")]) == len(suffix.TUNE_FACTORS)
    eligible = result["never_below_lookup"] or suffix_arms
    assert result["best"] in eligible
    assert result["overall"][result["best"]] == max(result["overall"][k] for k in eligible)
    lookup = result["estimates"]["ours/prompt-lookup"]
    assert all(result["estimates"][k][kind] >= lookup[kind] for k in result["never_below_lookup"] for kind in lookup)
    text = suffix.tune_markdown(result, {"target": "tiny", "command": "x", "prompts": 2, "max_new_tokens": 16,
                                         "machine": "test", "step_ms": 1.0})
    assert f"suffix_factor {result['best_factor']:g}" in text
