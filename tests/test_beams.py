"""Beam search reproduces transformers' num_beams search token for token; beam sampling draws from its joint."""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, generate
from decoders.__main__ import main as cli_main
from decoders.beams import beam_sampling, beam_search
from decoders.beams.search import joint_distribution
from decoders.beams.state import BeamRows, FinishedPool
from decoders.beams.trace import BeamTrace, BeamTraceError, load_any
from decoders.options import OptionsError
from decoders.sampling import Warp
from chi_square import chi_square_pvalue
from tiny import noisy_copy, tiny_gemma3, tiny_llama, tiny_qwen2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _hf_beams(model, prompt, width, max_new, eos, length_penalty, early_stopping) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=width, do_sample=False,
                         max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos,
                         length_penalty=length_penalty, early_stopping=early_stopping)
    tokens = out[0, len(prompt):].tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _eos_that_fires(model, prompt, width) -> int:
    """A token the beams produce early: the third generated token of a run without EOS, so EOS ends hypotheses."""
    return beam_search(model, prompt, width, 4, set()).tokens[2]


@pytest.mark.parametrize("seed,width,length_penalty,early_stopping", [
    (0, 2, 1.0, False), (1, 3, 1.0, True), (2, 4, 0.5, False), (3, 3, 2.0, "never"), (4, 2, -1.0, False),
])
def test_beam_search_equals_transformers(seed, width, length_penalty, early_stopping):
    lm = (tiny_llama if seed % 2 == 0 else tiny_qwen2)(vocab=48, seed=seed)
    prompt = [(7 * seed + i * 5) % 48 for i in range(6)]
    eos = _eos_that_fires(lm.model, prompt, width)
    expected = _hf_beams(lm.model, prompt, width, 12, eos, length_penalty, early_stopping)
    ours = beam_search(lm.model, prompt, width, 12, {eos}, length_penalty, early_stopping)
    assert ours.tokens == expected


def test_beam_search_eos_ends_the_best_candidate_somewhere():
    """The EOS chosen by _eos_that_fires really ends hypotheses (so the tests above exercise the finished pool)."""
    hits = 0
    for seed in range(4):
        lm = tiny_llama(vocab=48, seed=seed)
        prompt = [(7 * seed + i * 5) % 48 for i in range(6)]
        eos = _eos_that_fires(lm.model, prompt, 3)
        result = beam_search(lm.model, prompt, 3, 12, {eos})
        hits += any(c.tokens and c.tokens[-1] == eos for c in result.candidates)
    assert hits >= 2


@pytest.mark.slow
def test_beam_search_equals_transformers_on_smollm2():
    """Real weights (SmolLM2-135M, float32), one short prompt, width 3, its own EOS."""
    from decoders.runtime.models import load_model

    lm = load_model("smollm2-135m", dtype="float32")
    prompt = lm.encode_prompt("Name three colours.", chat=True)
    eos = lm.eos_token_ids[0]
    expected = _hf_beams(lm.model, prompt, 3, 16, eos, 1.0, False)
    assert beam_search(lm.model, prompt, 3, 16, {eos}).tokens == expected


def test_beam_search_equals_transformers_past_a_sliding_window():
    """Gemma3 with a 6-token window: reordering the rows of sliding layers keeps beam search exact."""
    lm = tiny_gemma3(vocab=32, seed=0)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    assert beam_search(lm.model, prompt, 3, 12, {31}).tokens == _hf_beams(lm.model, prompt, 3, 12, 31, 1.0, False)


def test_dsbd_on_sliding_window_layers_is_refused_with_a_fix():
    lm = tiny_gemma3(vocab=32, seed=0)
    options = DecodeOptions(model="tiny", method="dsbd", width=3, temperature=1.0, max_new_tokens=4)
    with pytest.raises(OptionsError, match="use beam-sampling with this model"):
        generate(options, [1, 2, 3], target=lm, draft=lm)


def test_beam_search_one_token_prompt_and_no_eos():
    lm = tiny_llama(vocab=32, seed=5)
    expected = _hf_beams(lm.model, [3], 3, 8, 31, 1.0, False)
    assert beam_search(lm.model, [3], 3, 8, {31}).tokens == expected


def test_beam_rows_reorder_gathers_parent_rows():
    lm = tiny_llama(vocab=32, seed=0)
    rows = BeamRows(lm.model)
    rows.prefill([1, 2, 3])
    rows.reorder([0, 0, 0])
    rows.step([4, 5, 6])  # three different continuations of one prefix
    keys = rows.cache.layers[0].keys.clone()  # (3, H, 4, D)
    rows.reorder([2, 0, 2])
    after = rows.cache.layers[0].keys
    assert torch.equal(after[0], keys[2]) and torch.equal(after[1], keys[0]) and torch.equal(after[2], keys[2])
    assert rows.kv_bytes() == sum(l.keys.numel() * 4 * 2 for l in rows.cache.layers)


def test_finished_pool_keeps_the_best():
    pool = FinishedPool(2)
    for tokens, score in (([1], -3.0), ([2], -1.0), ([3], -2.0)):
        pool.add(tokens, score)
    assert [c.tokens for c in pool.items] == [[2], [3]] and pool.full and pool.worst() == -2.0


def test_joint_distribution_sums_to_one_over_beams_and_tokens():
    scores = torch.tensor([0.0, -1.0])
    logits = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    joint = joint_distribution(scores, logits, Warp(1.0))  # (10,)
    expected = torch.softmax((scores[:, None] + torch.log_softmax(logits, -1)).reshape(-1), -1)
    assert torch.allclose(joint, expected) and abs(float(joint.sum()) - 1) < 1e-6


def test_beam_sampling_first_two_steps_match_exact_enumeration():
    """Two steps of width-2 beam sampling on a 4-token vocabulary: the (step-1, step-2) pair distribution of the
    first beam equals the exact joint computed from the model's own distributions."""
    lm = tiny_llama(vocab=4, seed=3, scale=0.5)
    prompt, width, warp = [1, 2], 2, Warp(1.0)
    exact = _exact_two_step_first_beam(lm.model, prompt, width, warp)  # (8, 8): step-1 (b,v) x step-2 (b,v)
    counts = torch.zeros(8, 8)
    generator = torch.Generator().manual_seed(0)
    for _ in range(1500):
        steps = beam_sampling(lm.model, prompt, width, 2, set(), warp, generator).steps
        first = steps[0]["parents"][0] * 4 + steps[0]["tokens"][0]
        second = steps[1]["parents"][0] * 4 + steps[1]["tokens"][0]
        counts[first, second] += 1
    assert chi_square_pvalue(counts, exact) > 1e-3


def _exact_two_step_first_beam(model, prompt, width, warp):
    """P(first draw of step 1 = x1, first draw of step 2 = x2), summing over the second draw of step 1."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1:]  # (1, V)
    p1 = joint_distribution(torch.zeros(1), logits, warp)  # (V,) step 1 from the single prompt row
    vocab = logits.shape[-1]
    table = torch.zeros(2 * vocab, 2 * vocab)
    for a in range(vocab):
        for b in range(vocab):  # the two step-1 draws (beam 0 and beam 1)
            seqs = [prompt + [a], prompt + [b]]
            with torch.no_grad():
                step_logits = model(torch.tensor(seqs)).logits[:, -1]  # (2, V)
            scores = torch.log(torch.stack([p1[a], p1[b]]))
            p2 = joint_distribution(scores, step_logits, warp)  # (2V,)
            table[a] += p1[a] * p1[b] * p2
    return table


# --- options, API and the beam trace ---------------------------------------------------------------------------
@pytest.mark.parametrize("fields, fix", [
    ({"method": "beam-search", "temperature": 0.7}, "set temperature 0"),
    ({"method": "beam-sampling", "temperature": 0.0}, "set temperature above 0"),
    ({"method": "dsbd", "temperature": 1.0, "width": 6, "top_k": 4}, "raise top_k to at least 6"),
    ({"method": "dsbd", "temperature": 1.0, "width": 3, "min_width": 4},
     "min_width must be a whole number from 1 to 3"),
    ({"method": "dsbd", "temperature": 1.0, "thres": 0.0}, "thres must be in (0, 1]"),
    ({"method": "beam-search", "early_stopping": "soon"}, "choose one of: false, true, never"),
    ({"method": "beam-sampling", "temperature": 1.0, "width": 0}, "width must be a whole number from 1 to 64"),
])
def test_impossible_beam_options_say_how_to_fix_them(fields, fix):
    with pytest.raises(OptionsError, match=None) as err:
        DecodeOptions(**fields).validate()
    assert fix in str(err.value)


def test_api_runs_every_beam_method_and_the_trace_round_trips():
    target = tiny_llama(vocab=32, seed=0).with_eos(5)
    draft = noisy_copy(target, 0.1)
    for method, extra in (("beam-search", {}), ("beam-sampling", {"temperature": 1.0}),
                          ("dsbd", {"temperature": 1.0, "gamma": 3, "one_input_beam": True})):
        options = DecodeOptions(model="tiny", method=method, width=3, max_new_tokens=9, **extra)
        trace = generate(options, [1, 2, 3], target=target, draft=draft)
        assert isinstance(trace, BeamTrace) and trace.stop_reason in ("eos", "max_new_tokens")
        assert trace.candidates and trace.output_ids == trace.candidates[0]["tokens"]
        assert 1 <= len(trace.output_ids) <= 9 and trace.totals["target_forwards"] == len(trace.iterations)
        again = load_any(trace.to_json())
        assert again == trace


def test_api_beam_search_is_the_beam_search_function():
    target = tiny_llama(vocab=32, seed=4)
    trace = generate(DecodeOptions(model="tiny", method="beam-search", width=3, max_new_tokens=8), [4, 5],
                     target=target)
    assert trace.output_ids == beam_search(target.model, [4, 5], 3, 8, set()).tokens


def test_beam_trace_rejects_a_node_whose_parent_is_not_in_the_previous_layer():
    target = tiny_llama(vocab=32, seed=0)
    trace = generate(DecodeOptions(model="tiny", method="beam-sampling", width=2, temperature=1.0, max_new_tokens=3),
                     [1, 2], target=target)
    data = trace.to_dict()
    data["iterations"][0]["nodes"][-1]["parent"] = data["iterations"][0]["nodes"][-1]["id"]
    with pytest.raises(BeamTraceError, match="is not a node of the previous layer"):
        BeamTrace.from_dict(data)


def test_chain_traces_still_load_through_load_any():
    from decoders import Trace

    target = tiny_llama(vocab=32, seed=0)
    trace = generate(DecodeOptions(model="tiny", max_new_tokens=3), [1, 2], target=target)
    assert isinstance(load_any(trace.to_json()), Trace)


def test_cli_rejects_impossible_beam_options_in_one_line(capsys):
    assert cli_main(["run", "--method", "dsbd", "--temperature", "1", "--width", "5", "--top-k", "3",
                     "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: width 5 is more than the 3") and err.count("\n") == 1


def test_cli_prints_a_dsbd_run_and_exits_0(monkeypatch, capsys):
    """`python -m decoders run --method dsbd` on the Qwen pair printed its run, then ended with an AttributeError
    (status 1): a beam trace has no baseline_check (found while checking issue 23 item 5's exit codes)."""
    import decoders.__main__ as cli

    target = tiny_qwen2(vocab=32, seed=0)
    draft = noisy_copy(target, 0.1)
    monkeypatch.setattr(cli, "generate", lambda options, prompt, compare_baseline=False: generate(
        options, [1, 2, 3], target=target, draft=draft))
    assert cli_main(["run", "--method", "dsbd", "--temperature", "1", "--width", "3", "--draft-model", "tiny",
                     "--max-new-tokens", "6", "--prompt", "hi"]) == 0
    assert "DSBD" in capsys.readouterr().out


@pytest.mark.parametrize("method", ["beam-search", "beam-sampling", "dsbd"])
def test_beam_decode_time_leaves_out_prefill_and_a_slow_consumer(method):
    """One clock with the chain loop (decoders/clock.py): a slow prefill lands in prefill_seconds and a consumer
    that takes its time with every yielded iteration does not count as decode time."""
    import time

    from decoders import stream

    target = tiny_llama(vocab=32, seed=0)
    draft = noisy_copy(target, 0.1)
    prefill, pause = 0.3, 0.05

    def slow_prefill(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        if cache is not None and cache.get_seq_length() == 0:  # the cache is empty: this forward is the prefill
            time.sleep(prefill)

    handles = [m.model.register_forward_pre_hook(slow_prefill, with_kwargs=True) for m in (target, draft)]
    try:
        options = DecodeOptions(model="tiny", method=method, width=2, max_new_tokens=8, gamma=2,
                                temperature=0.0 if method == "beam-search" else 1.0)
        trace, yields = None, 0
        began = time.perf_counter()
        for trace in stream(options, [1, 2, 3], target=target, draft=draft):
            yields += 1
            time.sleep(pause)  # the consumer (a renderer, a slow client)
        wall = time.perf_counter() - began
    finally:
        for handle in handles:
            handle.remove()
    assert yields >= 2
    assert trace.prefill_seconds >= prefill
    # whatever the machine's load: the run's wall time minus the slept prefill and consumer time bounds decode time
    assert trace.decode_seconds <= wall - prefill - pause * yields + 0.02
    assert trace.totals["tokens_per_second"] == pytest.approx(len(trace.output_ids) / trace.decode_seconds)


def test_finished_pool_keeps_each_sequence_once_so_full_means_distinct():
    pool = FinishedPool(2)
    pool.add([4, 5], -1.0, -3.0)
    pool.add([4, 5], -2.0, -3.0)  # the same sequence again, worse score: ignored
    assert not pool.full and len(pool.items) == 1
    pool.add([4, 5], -0.5, -3.0)  # the same sequence, better score: it keeps the better one
    assert [(c.tokens, c.score) for c in pool.items] == [([4, 5], -0.5)]
    pool.add([6], -0.7, -1.0)
    assert pool.full and [c.tokens for c in pool.items] == [[4, 5], [6]]


def _teacher_forced_logp(model, prompt: list[int], tokens: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]  # (T, V)
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).sum())


@pytest.mark.parametrize("method", ["beam-search", "beam-sampling", "dsbd"])
def test_candidates_are_distinct_and_carry_their_true_log_p(method):
    """Every candidate is a different sequence (no identical #1 and #2), and its logp is the target's own
    cumulative log-probability of its tokens, which the ranking score of beam sampling and DSBD is not."""
    target = tiny_llama(vocab=16, seed=3, scale=0.5).with_eos(5)
    draft = noisy_copy(target, 0.1)
    prompt = [1, 2, 3]
    gaps = []
    for seed in range(4):
        options = DecodeOptions(model="tiny", method=method, width=4, max_new_tokens=8, gamma=3, seed=seed,
                                temperature=0.0 if method == "beam-search" else 1.0)
        trace = generate(options, prompt, target=target, draft=draft)
        sequences = [tuple(c["tokens"]) for c in trace.candidates]
        assert len(sequences) == len(set(sequences))
        for c in trace.candidates:
            true = _teacher_forced_logp(target.model, prompt, c["tokens"])
            assert c["logp"] == pytest.approx(true, abs=1e-3)
            gaps.append(abs(c["score"] * len(c["tokens"]) - true))
    if method != "beam-search":  # the renormalised score is a different number
        assert max(gaps) > 0.1
