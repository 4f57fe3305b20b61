"""A long prompt is read in prefill chunks (decoders/runtime/runner.py CachedModel.prefill): the loop yields between two
chunks with trace.prefill saying how far it got, so closing the run (Stop) lands within one chunk; chunking changes
nothing a test can see in the output (greedy still equals the baseline, the EAGLE features are the same)."""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, generate, stream
from decoders.runtime import runner as runner_module

PROMPT = [(7 * i + 3) % 60 + 1 for i in range(50)]  # 50 tokens: 49 to prefill, the last is the first pending token
CHUNK = 8
METHODS = {
    "baseline": dict(),
    "draft model": dict(method="speculative", drafter="draft-model", rule="static", gamma=3),
    "EAGLE-2 tree, draft model": dict(method="speculative", drafter="eagle2", tree_k=2, tree_depth=3, tree_m=6),
    "layer skip": dict(method="speculative", drafter="layer-skip", skip_layers=(1, 2), rule="static", gamma=3),
    "prompt lookup": dict(method="speculative", drafter="prompt-lookup", rule="static", gamma=3),
}


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(runner_module, "PREFILL_CHUNK", CHUNK)


@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_output_is_the_unchunked_baselines(tiny, drafts, monkeypatch, name):
    options = DecodeOptions(max_new_tokens=20, **METHODS[name])
    monkeypatch.setattr(runner_module, "PREFILL_CHUNK", 10_000)  # the whole prompt in one forward, as before
    reference = generate(DecodeOptions(max_new_tokens=20), PROMPT, target=tiny).output_ids
    monkeypatch.setattr(runner_module, "PREFILL_CHUNK", CHUNK)
    traces = [(t.prefill and dict(t.prefill), len(t.rounds)) for t in stream(options, PROMPT, target=tiny,
                                                                           draft=drafts["noisy"])]
    reading = [p for p, rounds in traces if p]
    assert reading and all(rounds == 0 for p, rounds in traces if p)  # yields while reading come before any round
    targets = [p["read"] for p in reading if p["model"] == "target"]
    assert targets == list(range(CHUNK, len(PROMPT) - 1, CHUNK))  # one yield per chunk but the last
    drafts_read = [p["read"] for p in reading if p["model"] == "draft"]
    assert drafts_read == (targets if options.drafter in ("draft-model", "eagle2") and name != "baseline" else [])
    final = list(stream(options, PROMPT, target=tiny, draft=drafts["noisy"]))[-1]
    assert final.prefill is None and final.output_ids == reference


def test_closing_while_the_prompt_is_read_stops_within_one_chunk(tiny, drafts, small_chunks):
    forwards = []
    hooks = [lm.model.register_forward_pre_hook(lambda module, args, name=name: forwards.append(name))
             for name, lm in (("target", tiny), ("draft", drafts["noisy"]))]
    try:
        live = stream(DecodeOptions(method="speculative", drafter="draft-model", max_new_tokens=20), PROMPT,
                      target=tiny, draft=drafts["noisy"])
        trace = next(live)
        assert trace.prefill == {"model": "target", "read": CHUNK, "of": len(PROMPT) - 1} and not trace.rounds
        live.close()  # what Stop does
        assert forwards == ["target"] and trace.stop_reason == "cancelled"  # no second chunk was read

        forwards.clear()
        live = stream(DecodeOptions(method="speculative", drafter="draft-model", max_new_tokens=20), PROMPT,
                      target=tiny, draft=drafts["noisy"])
        trace = next(t for t in live if t.prefill and t.prefill["model"] == "draft")
        live.close()
        assert forwards.count("draft") == 1 and trace.stop_reason == "cancelled"  # the draft's own prefill too
    finally:
        for hook in hooks:
            hook.remove()


def test_chunked_features_are_the_one_forward_features(tiny):
    """The EAGLE head drafts from the prompt's last hidden states: read in chunks, they are the same states."""
    from decoders.runtime.runner import CachedModel
    from decoders.tree import DraftTree

    tokens = PROMPT[:-1]
    whole = CachedModel(tiny.model).forward_tree(DraftTree(tokens=tokens, parents=list(range(-1, len(tokens) - 1))),
                                                 hidden=True)[1]  # (49, H)
    runner = CachedModel(tiny.model)
    steps = list(runner.prefill(tokens, hidden=True, chunk=CHUNK))
    assert [read for read, _ in steps] == [8, 16, 24, 32, 40, 48, 49] and runner.length == len(tokens)
    assert torch.allclose(torch.cat([states for _, states in steps]), whole, atol=1e-5)


def test_time_between_chunks_is_neither_prefill_nor_decode_time(tiny, small_chunks):
    import time

    start = time.perf_counter()
    for trace in stream(DecodeOptions(max_new_tokens=3), PROMPT, target=tiny):
        if not trace.rounds:
            time.sleep(0.2)  # a slow consumer of the "reading the prompt" updates
    wall = time.perf_counter() - start
    assert wall > 1.2  # six chunk updates held for 0.2 s each
    assert trace.prefill_seconds + trace.decode_seconds < wall - 1.1
