"""Invalid options fail fast, before any model loads, with a message that says how to fix them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from decoders import DecodeOptions, OptionsError, generate

BAD = [
    (dict(max_new_tokens=0), "max_new_tokens must be a whole number from 1"),
    (dict(max_new_tokens=0), "at least 1 new token"),
    (dict(max_new_tokens=10**6), "max_new_tokens must be a whole number from 1 to 4096"),
    (dict(max_new_tokens=100000), "set max new tokens to 4096 or fewer"),
    (dict(temperature=-0.5), "temperature must be between 0"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_k=-1), "top_k must be 0"),
    (dict(method="beam"), "unknown method 'beam'; choose one of: baseline, speculative"),
    (dict(method="speculative", rule="entropy"), "unknown draft-length rule 'entropy'; choose one of: static, heuristic"),
    (dict(method="speculative", drafter="medusa"), "unknown drafter 'medusa'; choose one of: draft-model, prompt-lookup"),
    (dict(method="speculative", drafter="prompt-lookup", eagle_head="auto"), "eagle_head only applies to drafter 'eagle1' / 'eagle2' / 'ddd'"),
    (dict(method="speculative", drafter="prompt-lookup", rule="adaedl"), "prompt lookup copies tokens"),
    (dict(method="speculative", gamma=0), "gamma must be a whole number"),
    (dict(method="speculative", lam=1.5), "lam"),
    (dict(method="speculative", drafter="layer-skip", skip_layers=(0, 3)), "layer 0 cannot be skipped"),
    (dict(method="speculative", drafter="draft-model", skip_layers=(3,)), "skip_layers only applies"),
    (dict(method="speculative", drafter="prompt-lookup", draft_model="x"), "draft_model only applies"),
    (dict(dtype="int4"), "unknown dtype"),
]


@pytest.mark.parametrize("fields,message", BAD, ids=[m for _, m in BAD])
def test_invalid_options_say_how_to_fix(fields, message):
    with pytest.raises(OptionsError, match=message.replace("(", r"\(")):
        DecodeOptions(**fields).validate()


def test_prompt_errors(tiny):
    with pytest.raises(OptionsError, match="prompt is empty"):
        generate(DecodeOptions(), "   ", target=tiny)
    with pytest.raises(OptionsError, match="the prompt is 200 tokens; tiny-llama-0's context is 256 tokens, which "
                       "leaves room for 56 new tokens, not 100: cut at least 44 tokens from the prompt or lower max "
                       "new tokens to 56"):
        generate(DecodeOptions(max_new_tokens=100), [1] * 200, target=tiny)
    with pytest.raises(OptionsError, match=r"cut at least 54 tokens from the prompt to generate 10 new tokens \(at "
                       r"least 45 to generate any\)"):
        generate(DecodeOptions(max_new_tokens=10), [1] * 300, target=tiny)


def test_layer_skip_out_of_range(tiny):
    with pytest.raises(OptionsError, match="cannot skip layer"):
        generate(DecodeOptions(method="speculative", drafter="layer-skip", skip_layers=(9,)), [1, 2], target=tiny)


def test_draft_with_another_vocabulary_is_refused(tiny):
    from tiny import tiny_llama

    other = tiny_llama(vocab=32, seed=2)
    with pytest.raises(OptionsError, match="same model family"):
        generate(DecodeOptions(method="speculative"), [1, 2, 3], target=tiny, draft=other)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "decoders", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (["--max-new-tokens", "0"], "max_new_tokens must be a whole number"),
    (["--temperature", "-1"], "temperature must be between 0"),
    (["--method", "speculative", "--drafter", "prompt-lookup", "--rule", "adaedl"], "prompt lookup"),
    (["--method", "speculative", "--skip-layers", "a,b", "--drafter", "layer-skip"], "--skip-layers takes"),
    (["--model", "smolm2-135m"], "smollm2-135m"),  # a typo names the close match
])
def test_cli_fails_fast_without_traceback(args, message):
    result = run_cli("run", "--prompt", "hi", *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_cli_unknown_method_is_an_argparse_error():
    result = run_cli("run", "--prompt", "hi", "--method", "magic")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_cli_offers_the_tree_drafters_with_their_paper_defaults():
    from decoders.__main__ import build_parser, options_from

    args = build_parser().parse_args(["run", "--prompt", "hi", "--method", "speculative", "--drafter", "ddd",
                                      "--ddd-checks", "3,5", "--ddd-x", "-0.5", "--tree-m", "30"])
    options = options_from(args).validate()
    assert (options.drafter, options.ddd_checks, options.ddd_x, options.tree_m) == ("ddd", (3, 5), -0.5, 30)
    eagle2 = options_from(build_parser().parse_args(["run", "--prompt", "hi", "--method", "speculative",
                                                      "--drafter", "eagle2", "--eagle-head", "auto"])).validate()
    defaults = DecodeOptions()
    assert (eagle2.tree_k, eagle2.tree_depth, eagle2.tree_m, eagle2.eagle_head) == (
        defaults.tree_k, defaults.tree_depth, defaults.tree_m, "auto")


@pytest.mark.parametrize("args,message", [
    (["--drafter", "ddd", "--ddd-checks", "five"], "--ddd-checks takes"),
    (["--drafter", "ddd", "--ddd-checks", "1"], "ddd_checks must be whole expansion steps"),
    (["--drafter", "prompt-lookup", "--eagle-head", "auto"], "eagle_head only applies to drafter 'eagle1' / 'eagle2' / 'ddd'"),
])
def test_cli_tree_mistakes_are_one_line_messages(capsys, args, message):
    from decoders.__main__ import main

    assert main(["run", "--prompt", "hi", "--method", "speculative", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
