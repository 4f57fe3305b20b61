"""Word error rate and the word alignment behind it (for the coloured diff and the benchmarks), by the field's tools.

The convention of Whisper papers: both texts go through openai-whisper's own normaliser first, then jiwer counts
the edits. English uses EnglishTextNormalizer (lower case, punctuation and hyphens out, spellings unified,
"ten" -> "10", "Mr." -> "mister"); every other language uses BasicTextNormalizer (lower case, punctuation and
symbols out, diacritics kept, so Vietnamese tones still count). Figures made with SpecLab's earlier normaliser
(its own, simpler) are not comparable; the benchmarks say which one they used.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

NORMALIZER = "openai-whisper's EnglishTextNormalizer (en) / BasicTextNormalizer (others), then jiwer"


@lru_cache(maxsize=2)
def _normalizer(english: bool):
    from whisper.normalizers import BasicTextNormalizer, EnglishTextNormalizer

    return EnglishTextNormalizer() if english else BasicTextNormalizer()


def normalise(text: str, language: str = "en") -> list[str]:
    """The words WER compares: whisper's normaliser for `language`, split on whitespace."""
    return _normalizer(language == "en")(text).split()


@dataclass(frozen=True)
class WordOp:
    op: str         # "ok" | "sub" | "del" (reference word missing) | "ins" (extra hypothesis word)
    ref: str | None
    hyp: str | None


_OPS = {"equal": "ok", "substitute": "sub", "delete": "del", "insert": "ins"}


def align(reference: str, hypothesis: str, language: str = "en") -> list[WordOp]:
    """jiwer's minimum-edit alignment of the normalised words, one WordOp per word (an empty side allowed)."""
    import jiwer

    ref, hyp = normalise(reference, language), normalise(hypothesis, language)
    if not ref:  # jiwer needs a reference word; every hypothesis word is then an insertion
        return [WordOp("ins", None, w) for w in hyp]
    ops = []
    for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
        kind = _OPS[chunk.type]
        refs, hyps = ref[chunk.ref_start_idx:chunk.ref_end_idx], hyp[chunk.hyp_start_idx:chunk.hyp_end_idx]
        if kind == "del":
            ops += [WordOp("del", w, None) for w in refs]
        elif kind == "ins":
            ops += [WordOp("ins", None, w) for w in hyps]
        else:
            ops += [WordOp(kind, r, h) for r, h in zip(refs, hyps)]
    return ops


def wer(reference: str, hypothesis: str, language: str = "en") -> float:
    """(substitutions + deletions + insertions) / reference words; needs a reference with a word."""
    return corpus_wer([(reference, hypothesis)], language)


def corpus_wer(pairs: list[tuple[str, str]], language: str = "en") -> float:
    """Total edits over total reference words (jiwer over the whole list, not a mean of per-clip rates)."""
    import jiwer

    refs = [" ".join(normalise(r, language)) for r, _ in pairs]
    if not all(refs):
        raise ValueError("WER needs every reference to have at least one word after normalisation")
    hyps = [" ".join(normalise(h, language)) for _, h in pairs]
    return jiwer.wer(refs, hyps)
