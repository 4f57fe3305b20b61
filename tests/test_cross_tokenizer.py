"""The cross-tokenizer drafter (decoders/drafters/cross_tokenizer.py, decoders/retokenize.py): a draft model with a
tokenizer of its own. Greedy output equals the baseline token for token; sampled output follows the target (the
chi-square joint law of the first two tokens, a broken residual fails it); the draft's cache keeps spelling the
committed text; bad pairs get fix-it messages; the trace holds both tokenizations and the page draws them.

Toy tokenizers and models: tests/tiny_tokenizers.py (their boundaries do not line up with each other).
"""
from __future__ import annotations

import pytest
import torch

from decoders import DecodeOptions, OptionsError, Trace, generate
from decoders import registry, retokenize
from decoders import verify as core
from decoders.drafters.cross_tokenizer import LOOKBEHIND, CrossTokenizerDrafter
from decoders.sampling import Warp

from baselines import baseline_ids
from chi_square import chi_square_pvalue
from tiny_tokenizers import OTHER_MERGES, TARGET_MERGES, TOY_PROBES, bpe, byte_level_bpe, sentencepiece_like, \
    toy_models

PROMPTS = ["ab", "ab cab a", "c", "cc ab ba"]
LENGTHS = [1, 7, 30]
RULES = [("static", 1), ("static", 3), ("static", 5), ("heuristic", 2), ("max-confidence", 4), ("adaedl", 4)]
BOUND = 1e-3  # chi-square p-value: a correct sampler fails this 1 time in 1000; the broken residual lands far below
REAL_PROBES = retokenize.PROBES  # real text (CJK, an emoji, CRLF); the toy tokenizers get TOY_PROBES instead


@pytest.fixture(autouse=True)
def toy_probes(monkeypatch):
    """The toy tokenizers spell only "ab c": check them on text of that alphabet (the real PROBES are tested below)."""
    monkeypatch.setattr(retokenize, "PROBES", TOY_PROBES)


@pytest.fixture(scope="module")
def toys():
    return toy_models()


def cross(**more) -> DecodeOptions:
    return DecodeOptions(model="toy-target", method="speculative", drafter="cross-tokenizer", **more)


def ids(lm, text: str) -> list[int]:
    return lm.encode_prompt(text)


# ---- tokenizers as bytes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [byte_level_bpe, sentencepiece_like], ids=["byte-level BPE", "SentencePiece"])
def test_a_byte_complete_tokenizer_spells_every_probe(monkeypatch, make):
    monkeypatch.setattr(retokenize, "PROBES", REAL_PROBES)
    spelling = retokenize.spelling_of(make(), "toy")  # raises if any real probe (CJK, emoji, CRLF) comes back wrong
    for text in ("Café, naïve 世界 🙂", "\tx\r\n"):
        assert spelling.bytes_of(spelling.encode(text)) == text.encode()


def test_a_tokenizer_that_loses_text_is_refused_with_a_fix(monkeypatch):
    monkeypatch.setattr(retokenize, "PROBES", ("def f(x):\n    return x",))
    with pytest.raises(OptionsError, match="does not write text back exactly.*byte-level tokenizers"):
        retokenize.spelling_of(bpe(TARGET_MERGES), "toy-target")


def test_shared_pieces_pair_tokens_spelled_alike_and_move_q():
    target, other = (retokenize.spelling_of(bpe(m), n) for m, n in ((TARGET_MERGES, "t"), (OTHER_MERGES, "o")))
    shared = retokenize.shared_pieces(other, target, len(other.pieces), len(target.pieces))
    pairs = {other.piece(d): target.piece(t) for d, t in zip(shared.draft_ids.tolist(), shared.target_ids.tolist())}
    assert pairs and all(a == b for a, b in pairs.items())
    assert set(pairs) == {b"a", b"b", b" ", b"c", b"b ", b"</s>"}  # the alphabet, b␣ (in both) and EOS; not ba, aa
    q = torch.zeros(len(other.pieces))
    q[shared.draft_ids] = torch.rand(len(shared), generator=torch.Generator().manual_seed(0))
    q /= q.sum()
    moved = shared.to_target(q)  # (V_target,)
    assert float(moved.sum()) == pytest.approx(1.0)
    for d, t in zip(shared.draft_ids.tolist(), shared.target_ids.tolist()):
        assert float(moved[t]) == pytest.approx(float(q[d]))


def test_text_stream_waits_for_a_whole_character():
    stream = retokenize.TextStream()
    smile = "🙂".encode()
    stream.push(b"ok " + smile[:2])
    assert bytes(stream.text) == b"ok " and stream.pending
    stream.push(smile[2:] + b"\xff!")  # the rest of the emoji, then a byte that is no UTF-8: shown as U+FFFD
    assert bytes(stream.text).decode() == "ok 🙂\ufffd!" and not stream.pending


# ---- greedy: the baseline, token for token --------------------------------------------------------------------

@pytest.mark.parametrize("draft", ["twin", "noisy", "other", "bos"])
@pytest.mark.parametrize("rule,gamma", RULES, ids=[f"{r}-{g}" for r, g in RULES])
def test_greedy_equals_the_baseline(toys, draft, rule, gamma):
    target = toys["target"]
    for text in PROMPTS:
        prompt = ids(target, text)
        for length in LENGTHS:
            trace = generate(cross(rule=rule, gamma=gamma, max_draft=6, max_new_tokens=length), prompt,
                             target=target, draft=toys[draft])
            assert trace.output_ids == baseline_ids(target, prompt, length), (text, length)
            assert len(trace.output_ids) == length


def test_the_equality_is_not_trivial(toys):
    """Across the prompts the twin's drafts are often accepted, some rounds accept part of a draft, and some target
    tokens join or split the draft's pieces: the rollback and the re-tokenization are both exercised."""
    rounds = [r for text in PROMPTS for r in generate(cross(gamma=4, max_new_tokens=30), ids(toys["target"], text),
                                                     target=toys["target"], draft=toys["twin"]).rounds]
    drafted, accepted = sum(r.n_drafted for r in rounds), sum(r.n_accepted for r in rounds)
    assert 0.3 < accepted / drafted < 1.0
    assert any(0 < r.n_accepted < r.n_drafted for r in rounds)
    assert any(len(node["pieces"]) != 1 for r in rounds if r.retokenized for node in r.retokenized["nodes"])
    other = generate(cross(gamma=4, max_new_tokens=30), ids(toys["target"], "ab cab a"), target=toys["target"],
                     draft=toys["other"])
    assert any(len(node["pieces"]) > 1 for r in other.rounds if r.retokenized for node in r.retokenized["nodes"])


def test_end_of_sequence_is_honoured_exactly(toys):
    from dataclasses import replace

    target = toys["target"]
    prompt = ids(target, "ab cab a")
    free = baseline_ids(target, prompt, 30)
    eos = free[9]
    stopped = replace(target, eos_token_ids=(eos,))
    expected = baseline_ids(stopped, prompt, 30)
    assert expected == free[:free.index(eos) + 1]
    trace = generate(cross(gamma=5, max_new_tokens=30), prompt, target=stopped, draft=toys["twin"])
    assert trace.output_ids == expected and trace.stop_reason == "eos"


class _Checked(CrossTokenizerDrafter):
    """After every round's sync the draft's cache holds draft tokens that spell the committed text exactly, but for
    the bytes the round healed (its first draft spells them again)."""

    rounds: list[tuple[int, int]] = []
    first: list[int] = []
    healed = 0  # rounds whose first draft healed the text's last token

    def propose(self, ids, limit, rule, warp, generator, record):
        proposal = super().propose(ids, limit, rule, warp, generator, record)
        if proposal.tree.n_drafted:
            head = len(self.draft.start)
            assert self.draft.bytes_of(self.fed[head:self.trusted]) + self.held == bytes(self.committed.text)
            if len(self.fed) > self.trusted:  # the first draft was fed (the round's limit went past it)
                assert self.draft.bytes_of(self.fed[self.trusted:self.trusted + 1]).startswith(self.held)
            _Checked.healed += bool(self.held)
            assert self.runner.length == len(self.fed) == len(self.ends)
            _Checked.rounds.append((len(self.fed), self.trusted))
            _Checked.first.append(self.fed[0])
        return proposal


def test_a_draft_with_its_own_bos_keeps_it_first(toys, monkeypatch):
    from dataclasses import replace

    spec = registry.DRAFTERS["cross-tokenizer"]
    monkeypatch.setitem(registry.DRAFTERS, "cross-tokenizer", replace(spec, build=_Checked.from_context))
    _Checked.rounds, _Checked.first = [], []
    bos = toys["bos"].tokenizer.bos_token_id
    target = toys["target"]
    trace = generate(cross(gamma=4, max_new_tokens=30), ids(target, "cc ab ba"), target=target, draft=toys["bos"])
    assert trace.output_ids == baseline_ids(target, ids(target, "cc ab ba"), 30)
    assert _Checked.first and set(_Checked.first) == {bos}  # every round's draft context starts with its BOS


def test_token_healing_respells_the_texts_last_token_and_stays_exact(toys, monkeypatch):
    """The toy draft's "b" starts "ba" and "b ": rounds whose text ends in such a token heal it (the first draft
    spells its bytes again); the cache invariant holds (_Checked) and the output is the baseline's."""
    from dataclasses import replace

    spec = registry.DRAFTERS["cross-tokenizer"]
    monkeypatch.setitem(registry.DRAFTERS, "cross-tokenizer", replace(spec, build=_Checked.from_context))
    _Checked.healed = 0
    target = toys["target"]
    prompt = ids(target, "cc ab ba")
    trace = generate(cross(gamma=4, max_new_tokens=40), prompt, target=target, draft=toys["other"])
    assert trace.output_ids == baseline_ids(target, prompt, 40)
    healed = [r.retokenized for r in trace.rounds if r.retokenized and r.retokenized["context"]["healed"]]
    assert _Checked.healed > 0 and len(healed) == _Checked.healed
    for info in healed:  # the first piece starts inside the committed text, by the healed bytes
        assert info["pieces"][0]["start"] == -len(info["context"]["healed"].encode())
        assert info["pieces"][0]["text"].startswith(info["context"]["healed"])
    from app.figures.retokenize import retokenize_figure

    index = next(r.index for r in trace.rounds if r.retokenized and r.retokenized["context"]["healed"])
    figure = retokenize_figure(trace, index)  # the page says so: on the healed piece's hover and in the summary
    assert any("token healing" in h.replace("<br>", " ") for t in figure.data for h in t.hovertext)
    assert "(token healing)" in figure.layout.meta and figure.layout.xaxis.range[0] < 0


def test_the_prefix_index_finds_every_token_that_starts_with_some_bytes():
    spelling = retokenize.Spelling("toy", (b"a", b"ab", b"abc", b"b", b"", b"\xff", b"\xff\xff", b"ac"), lambda t: [])
    index = retokenize.PrefixIndex.of(spelling, 8)
    assert sorted(index.starting_with(b"a")) == [0, 1, 2, 7]
    assert sorted(index.starting_with(b"ab")) == [1, 2] and index.starting_with(b"abd") == []
    assert sorted(index.starting_with(b"\xff")) == [5, 6]  # no byte after 0xff: the range runs to the end
    assert index.extends(b"a") and index.extends(b"ab") and index.extends(b"\xff")
    assert not index.extends(b"abc") and not index.extends(b"b") and not index.extends(b"ac")


def test_the_draft_cache_follows_the_committed_text(toys, monkeypatch):
    from dataclasses import replace

    spec = registry.DRAFTERS["cross-tokenizer"]
    monkeypatch.setitem(registry.DRAFTERS, "cross-tokenizer", replace(spec, build=_Checked.from_context))
    _Checked.rounds = []
    target = toys["target"]
    trace = generate(cross(gamma=4, max_new_tokens=40), ids(target, "cc ab ba"), target=target, draft=toys["other"])
    assert len(_Checked.rounds) > 5
    # Catching up costs at most a token per byte the target committed last round, plus the LOOKBEHIND tokens encoded
    # again (toy pieces hold at most 2 bytes) and the last one fed again for its logits: not the whole text.
    for before, rnd in zip(trace.rounds, trace.rounds[1:]):
        if rnd.retokenized:
            committed = len(target.decode(before.committed).encode())
            assert rnd.retokenized["context"]["fed"] <= committed + 2 * LOOKBEHIND + 1, rnd.index


# ---- sampling: only where it stays exact ----------------------------------------------------------------------

def _exact_pairs(lm, prompt: list[int]) -> torch.Tensor:
    """P(x1, x2 | prompt) under the target at temperature 1, (V, V), by enumeration."""
    vocab = lm.model.config.vocab_size
    with torch.inference_mode():
        first = Warp(1.0).probs(lm.model(torch.tensor([prompt])).logits[0, -1])  # (V,)
        second = Warp(1.0).probs(lm.model(torch.tensor([prompt + [x] for x in range(vocab)])).logits[:, -1])  # (V, V)
    return first[:, None] * second


def _sampled_pairs(toys, draft: str, runs: int, prompt: list[int]) -> tuple[torch.Tensor, int, int]:
    vocab = toys["target"].model.config.vocab_size
    counts, accepted, rejected = torch.zeros(vocab, vocab), 0, 0
    for seed in range(runs):
        trace = generate(cross(gamma=3, max_new_tokens=4, temperature=1.0, seed=seed, record=False), prompt,
                         target=toys["target"], draft=toys[draft])
        x1, x2 = trace.output_ids[:2]
        counts[x1, x2] += 1
        accepted += sum(r.n_accepted for r in trace.rounds)
        rejected += sum(r.n_drafted > r.n_accepted for r in trace.rounds)
    return counts, accepted, rejected


def test_sampled_output_follows_the_target(toys):
    prompt = ids(toys["target"], "ab c")
    counts, accepted, rejected = _sampled_pairs(toys, "noisy", 600, prompt)
    assert accepted > 100 and rejected > 100  # both branches of the test ran many times
    pvalue = chi_square_pvalue(counts, _exact_pairs(toys["target"], prompt))
    assert pvalue > BOUND, f"chi-square p = {pvalue:.2e}"


def test_a_broken_residual_fails_the_sampling_test(toys, monkeypatch):
    monkeypatch.setattr(core, "residual", lambda r, q: r)
    prompt = ids(toys["target"], "ab c")
    counts, _, _ = _sampled_pairs(toys, "other", 400, prompt)
    pvalue = chi_square_pvalue(counts, _exact_pairs(toys["target"], prompt))
    assert pvalue < BOUND, f"the mutated residual went unnoticed (chi-square p = {pvalue:.2e})"


def test_sampled_drafts_come_only_from_the_shared_tokens(toys):
    trace = generate(cross(gamma=4, max_new_tokens=30, temperature=1.0, seed=3), ids(toys["target"], "ab"),
                     target=toys["target"], draft=toys["other"])
    target, other = toys["target"].tokenizer, toys["other"].tokenizer
    shared = {p for p in target.get_vocab() if p in other.get_vocab()}
    rounds = [r for r in trace.rounds if r.retokenized]
    assert rounds and all(r.retokenized["mode"] == "shared" for r in rounds)
    for rnd in rounds:
        assert len(rnd.retokenized["pieces"]) == rnd.n_drafted  # one target token per draft token
        for node in rnd.nodes[1:]:
            assert target.convert_ids_to_tokens(node.token) in shared
            assert node.q is not None  # q moved onto the target's vocabulary: a real draft probability
    assert trace.totals["cross_tokenizer"]["shared_tokens"] == 6


def test_no_shared_token_means_no_exact_sampling(toys, monkeypatch):
    from decoders.drafters import cross_tokenizer

    monkeypatch.setattr(cross_tokenizer, "shared_pieces", lambda draft, target, vd, vt: retokenize.SharedPieces(
        torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), vd, vt))
    with pytest.raises(OptionsError, match="spell no token alike.*temperature 0"):
        generate(cross(temperature=1.0), ids(toys["target"], "ab"), target=toys["target"], draft=toys["other"])


# ---- pairs, options, the registry ---------------------------------------------------------------------------------

def test_a_draft_without_a_tokenizer_gets_a_fix(toys):
    from tiny import tiny_llama

    bare = tiny_llama(vocab=9, seed=4)
    with pytest.raises(OptionsError, match="needs its tokenizer.*load_model"):
        generate(cross(), ids(toys["target"], "ab"), target=toys["target"], draft=bare)


def test_another_vocabulary_is_refused_by_the_draft_model_drafter_but_not_by_this_one(toys):
    other = toys["other"]
    assert other.model.config.vocab_size != toys["target"].model.config.vocab_size
    from decoders.runtime.models import ModelError

    with pytest.raises(ModelError, match="drafter 'cross-tokenizer'"):  # the tokenizers differ
        generate(DecodeOptions(method="speculative", max_new_tokens=3), [1, 2], target=toys["target"], draft=other)
    assert len(generate(cross(max_new_tokens=3), [1, 2], target=toys["target"], draft=other).output_ids) == 3


def test_the_registry_offers_it_with_every_rule_and_a_default_draft():
    from decoders.api import draft_for

    spec = registry.DRAFTERS["cross-tokenizer"]
    assert spec.own_tokenizer and spec.uses_draft_model(DecodeOptions()) and set(spec.rules) == set(registry.RULES)
    options = DecodeOptions(model="qwen2.5-coder-1.5b", method="speculative", drafter="cross-tokenizer").validate()
    assert draft_for(options) == "smollm2-135m"
    assert draft_for(DecodeOptions(model="qwen2.5-coder-1.5b", method="speculative")) == "qwen2.5-coder-0.5b"
    with pytest.raises(OptionsError, match="no default draft model for drafter 'cross-tokenizer'"):
        draft_for(DecodeOptions(model="smollm2-135m", method="speculative", drafter="cross-tokenizer"))
    assert "cross-tokenizer" in registry.label(options)


# ---- the trace and the page -----------------------------------------------------------------------------------

def test_the_trace_keeps_both_tokenizations_and_loads_back(toys):
    trace = generate(cross(gamma=4, max_new_tokens=20), ids(toys["target"], "cc ab ba"), target=toys["target"],
                     draft=toys["other"])
    rnd = next(r for r in trace.rounds if r.retokenized and r.retokenized["pieces"])
    info = rnd.retokenized
    assert [p["text"] for p in info["pieces"]] == [toys["other"].tokenizer.decode([p["id"]]) for p in info["pieces"]]
    healed = info["context"]["healed"].encode()
    drafted = "".join(p["text"] for p in info["pieces"]).encode()
    assert drafted.startswith(healed) and info["pieces"][0]["start"] == -len(healed)
    drafted = drafted[len(healed):]  # the text's last bytes, spelled again by a healed first piece, are not drafted
    assert info["pieces"][-1]["end"] == len(drafted)
    for entry in info["nodes"]:  # each target token's bytes are the drafted text's bytes at its span
        node = rnd.nodes[entry["node"]]
        assert drafted[entry["start"]:entry["end"]] == node.text.encode()
    loaded = Trace.from_json(trace.to_json())
    assert loaded.rounds[rnd.index].retokenized == info


def test_the_page_draws_the_two_tokenizations(toys):
    from app.figures.retokenize import retokenize_figure
    from app.figures.tree import tree_figure

    trace = generate(cross(gamma=4, max_new_tokens=20), ids(toys["target"], "cc ab ba"), target=toys["target"],
                     draft=toys["other"])
    index = next(r.index for r in trace.rounds if r.retokenized and r.retokenized["pieces"])
    figure = retokenize_figure(trace, index)
    hovers = [h for t in figure.data for h in t.hovertext]
    assert any("the draft's token" in h for h in hovers) and any("the target's token" in h for h in hovers)
    assert any("from " in h and "draft token" in h for h in hovers)  # a target token names its draft pieces
    assert "re-tokenized into" in figure.layout.title.text and figure.layout.meta
    tree_hovers = [h for t in tree_figure(trace, index).data if t.hovertext for h in t.hovertext]
    assert any("re-tokenized" in h for h in tree_hovers)
    plain = generate(DecodeOptions(method="speculative", drafter="prompt-lookup", max_new_tokens=5), [1, 2, 1, 2],
                     target=toys["target"])
    assert retokenize_figure(plain, 0) is None


# ---- the draft reads a long prompt in chunks ------------------------------------------------------------------------

def test_stop_during_the_drafts_prefill_lands_within_one_chunk(toys, monkeypatch):
    """The draft reads the prompt in its own tokens in the runner's prefill chunks, as the target does, and the run
    yields between two: closing it there (Stop) reads no further chunk. It used to read the prompt in one forward,
    which nothing could interrupt. The output is unchanged."""
    from decoders import stream
    from decoders.runtime import runner as runner_module

    chunk = 4
    target, draft = toys["target"], toys["other"]
    prompt = ids(target, "ab cab a cc ab ba " * 4)
    reference = baseline_ids(target, prompt, 12)
    monkeypatch.setattr(runner_module, "PREFILL_CHUNK", chunk)
    forwards = []
    hook = draft.model.register_forward_pre_hook(
        lambda module, args, kwargs: forwards.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        live = stream(cross(gamma=3, max_new_tokens=12), prompt, target=target, draft=draft)
        reading = None
        for trace in live:
            if trace.rounds:
                break
            if trace.prefill and trace.prefill["model"] == "draft":
                reading = dict(trace.prefill)
                break
        live.close()  # what Stop does
        assert reading is not None, "the draft read the whole prompt without yielding"
        assert len(forwards) == 1 and trace.stop_reason == "cancelled"  # one chunk, then it stopped
        assert 0 < reading["read"] < reading["of"] == len(prompt) - 1
        forwards.clear()
        whole = generate(cross(gamma=3, max_new_tokens=12), prompt, target=target, draft=draft)
        assert whole.output_ids == reference and whole.prefill is None
        assert forwards[:3] == [chunk] * 3  # the draft's prefill went in chunks
    finally:
        hook.remove()
