"""Small real tokenizers (the `tokenizers` library, no downloads) and tiny models that speak them, for the
cross-tokenizer drafter's exact checks (tests/test_cross_tokenizer.py).

Two BPE vocabularies over the alphabet "a", "b", " ", "c" (plus "</s>"):
  TARGET  merges ab, ␣a, cc, b␣                    ids in one order
  TWIN    the same pieces and merges, ids reversed: the target's twin model (rows permuted) predicts exactly what
          the target predicts wherever both see the same pieces, so many drafts are accepted; where the target
          itself wrote a piece another way than BPE would ("a","b" for "ab"), the twin's context differs and drafts
          are rejected
  OTHER   merges ba, b␣, aa, c␣, ba␣: token boundaries that do not line up with the target's, one more token
The PROBES the drafter checks tokenizers against are real text; these tokenizers spell only their alphabet, so the
tests swap in probes of that alphabet (`toy_probes`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from tiny import TinyLM, noisy_copy, tiny_llama

ALPHABET = ["a", "b", " ", "c"]
TARGET_MERGES = [("a", "b"), (" ", "a"), ("c", "c"), ("b", " ")]
OTHER_MERGES = [("b", "a"), ("b", " "), ("a", "a"), ("c", " "), ("ba", " ")]
EOS = "</s>"
BOS = "<s>"
TOY_PROBES = ("ab cab a", "cc ba b", "a")


def bpe(merges: list[tuple[str, str]], reverse: bool = False, bos: bool = False) -> PreTrainedTokenizerFast:
    """A BPE tokenizer over ALPHABET with these merges (ids reversed when asked), "</s>" as EOS; with `bos`, it puts
    "<s>" before every text it encodes with special tokens (as Gemma's does)."""
    names = ALPHABET + [a + b for a, b in merges]
    ids = list(range(len(names)))[::-1] if reverse else list(range(len(names)))
    tokenizer = Tokenizer(models.BPE(dict(zip(names, ids)), merges))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([EOS] + [BOS] * bos)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A",
                                                                 special_tokens=[(BOS, tokenizer.token_to_id(BOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=BOS if bos else None)


def byte_level_bpe() -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE (every byte is a token; a few merges): what SmolLM2 and Qwen use."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def sentencepiece_like() -> PreTrainedTokenizerFast:
    """SentencePiece style: ▁ for a space, <0xNN> byte fallback for anything without a piece (like Gemma's)."""
    pieces = ["▁", "a", "b", "d", "e", "▁a", "de"] + [f"<0x{b:02X}>" for b in range(256)]
    tokenizer = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [("▁", "a"), ("d", "e")],
                                     byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@dataclass
class TokenizedLM(TinyLM):
    """A tiny model with a real tokenizer: what decoders.runtime.models.LoadedModel gives the cross-tokenizer drafter."""

    tokenizer: object = None

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def twin(target: TokenizedLM, tokenizer, noise: float = 0.0, seed: int = 1) -> TokenizedLM:
    """The target's model re-indexed for `tokenizer` (same pieces, other ids): row j of the draft's embedding and
    LM head is the target's row of the piece the draft calls j; noise > 0 perturbs every weight first."""
    lm = TinyLM(target.model)
    model = noisy_copy(lm, noise=noise, seed=seed).model if noise else copy.deepcopy(target.model)
    target_ids = target.tokenizer.get_vocab()
    order = torch.tensor([target_ids[piece] for piece, _ in sorted(tokenizer.get_vocab().items(),
                                                                    key=lambda item: item[1])])  # (V,)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(model.get_input_embeddings().weight[order])
        model.get_output_embeddings().weight.copy_(model.get_output_embeddings().weight[order])
    return TokenizedLM(model, name=f"twin-{noise}", tokenizer=tokenizer)


def toy_models(seed: int = 1) -> dict:
    """A toy target and four drafts: its exact twin, a noisy twin, an unrelated model with other merges, and one whose
    tokenizer starts every text with a BOS of its own."""
    target_tokenizer, twin_tokenizer, other_tokenizer = bpe(TARGET_MERGES), bpe(TARGET_MERGES, True), \
        bpe(OTHER_MERGES)
    target = TokenizedLM(tiny_llama(vocab=len(target_tokenizer), seed=seed, layers=2, scale=0.5).model,
                         name="toy-target", tokenizer=target_tokenizer)
    other = TokenizedLM(tiny_llama(vocab=len(other_tokenizer), seed=11, layers=2, scale=0.5).model,
                        name="toy-other", tokenizer=other_tokenizer)
    with_bos = bpe(OTHER_MERGES, bos=True)
    opener = TokenizedLM(tiny_llama(vocab=len(with_bos), seed=12, layers=2, scale=0.5).model, name="toy-bos",
                         tokenizer=with_bos)
    return {"target": target, "twin": twin(target, twin_tokenizer), "noisy": twin(target, twin_tokenizer, 0.15),
            "other": other, "bos": opener}
