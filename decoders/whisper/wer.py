"""Word error rate and the word alignment behind it (for the coloured diff and the benchmark).

Normalisation (ours, simple, stated): lower case, hyphens and slashes become spaces, other punctuation is
dropped, whitespace collapses, and whole numbers 0-99 become English words ("10 of clubs" = "ten of clubs":
Whisper writes digits, LibriVox/CMU references spell them). No other spelling normalisation (Whisper's
EnglishTextNormalizer does more; its figures are not comparable to these).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_SPLITTERS = re.compile(r"[-‐‑–—/]")


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def normalise(text: str) -> list[str]:
    text = _SPLITTERS.sub(" ", unicodedata.normalize("NFC", text).lower())
    kept = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    return [spelled for word in kept.split() for spelled in _spell(word)]


def _spell(word: str) -> list[str]:
    """'7' -> ['seven'], '42' -> ['forty', 'two']; anything else unchanged."""
    if not (word.isascii() and word.isdigit()) or int(word) > 99:
        return [word]
    n = int(word)
    if n < 20:
        return [_ONES[n]]
    return [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])


@dataclass(frozen=True)
class WordOp:
    op: str         # "ok" | "sub" | "del" (reference word missing) | "ins" (extra hypothesis word)
    ref: str | None
    hyp: str | None


def align(reference: str, hypothesis: str) -> list[WordOp]:
    """Levenshtein alignment over normalised words; ties prefer a substitution, then a deletion."""
    ref, hyp = normalise(reference), normalise(hypothesis)
    rows, cols = len(ref) + 1, len(hyp) + 1
    cost = [[0] * cols for _ in range(rows)]  # cost[i][j]: edits between ref[:i] and hyp[:j]
    for i in range(rows):
        cost[i][0] = i
    for j in range(cols):
        cost[0][j] = j
    for i in range(1, rows):
        for j in range(1, cols):
            cost[i][j] = min(cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]), cost[i - 1][j] + 1, cost[i][j - 1] + 1)
    ops, i, j = [], len(ref), len(hyp)
    while i or j:
        if i and j and cost[i][j] == cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            ops.append(WordOp("ok" if ref[i - 1] == hyp[j - 1] else "sub", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and cost[i][j] == cost[i - 1][j] + 1:
            ops.append(WordOp("del", ref[i - 1], None))
            i -= 1
        else:
            ops.append(WordOp("ins", None, hyp[j - 1]))
            j -= 1
    return ops[::-1]


def wer(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words; needs a non-empty reference."""
    n = len(normalise(reference))
    if n == 0:
        raise ValueError("WER needs a reference with at least one word")
    return sum(op.op != "ok" for op in align(reference, hypothesis)) / n


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    """Total edits over total reference words (not a mean of per-clip rates)."""
    edits = sum(sum(op.op != "ok" for op in align(r, h)) for r, h in pairs)
    return edits / max(1, sum(len(normalise(r)) for r, _ in pairs))
