"""Two tokenizers, one text: what a draft model with a tokenizer of its own needs to draft for the target (pure).

Every token id of a fast tokenizer stands for a fixed byte string: byte-level BPE writes bytes in GPT-2's byte
alphabet, SentencePiece writes ▁ for a space and <0xNN> for a byte it has no piece for, an added token is its own
content. `Spelling` keeps that table, so text moves between two vocabularies exactly, in bytes, and only whole
characters are ever re-encoded (a byte-level token may end inside a character).

How a draft's tokens reach the target (decoders/drafters/cross_tokenizer.py):
  re-tokenized  temperature 0: the draft's text is encoded by the target's tokenizer, any pair of tokenizers that
                spell the same text; greedy verification compares each token with the target's argmax.
  shared        temperature > 0: the draft samples only among its tokens that are one target token with the same
                bytes (the vocabulary intersection of Timor et al. 2025, "Lossless Speculative Decoding Algorithms
                for Heterogeneous Vocabularies", which transformers' UniversalSpeculativeDecodingGenerator uses), so
                its q is a distribution over the target's vocabulary and the residual norm(max(p − q, 0)) is exact.
"""
from __future__ import annotations

import bisect
import codecs
import json
import re
from dataclasses import dataclass
from typing import Callable

import torch

from .errors import OptionsError

# Text a draft and a target must both write back byte for byte: code, indentation, CRLF, accents, CJK, an emoji.
PROBES = ("def add(a, b):\n    return a + b  # sum\n", "\tx = [1, 2]\r\n", "Café, naïve façade.", "世界 🙂 ok")
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_bytes() -> dict[int, int]:
    """GPT-2's byte alphabet, inverted, as a str.translate table: the code point byte-level BPE writes for a byte ->
    that byte's code point (printable bytes are themselves; the others are written as 256, 257, ... in order)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | \
        set(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = byte
        else:
            table[256 + extra] = byte
            extra += 1
    return table


_GPT2_BYTES = _gpt2_bytes()


@dataclass(frozen=True)
class Spelling:
    """A tokenizer seen as bytes: the byte string of every token id, and text -> ids."""

    name: str
    pieces: tuple[bytes, ...]  # token id -> its bytes (b"" for an id the tokenizer does not name)
    encode: Callable[[str], list[int]]  # text -> ids; adds no BOS/EOS, parses special tokens written in the text
    start: tuple[int, ...] = ()  # what the tokenizer puts before a text of its own (a BOS), e.g. Gemma's (2,)

    def piece(self, token: int) -> bytes:
        return self.pieces[token] if 0 <= token < len(self.pieces) else b""

    def bytes_of(self, ids: list[int]) -> bytes:
        return b"".join(self.piece(token) for token in ids)


def spelling_of(tokenizer, name: str) -> Spelling:
    """The byte table of a transformers fast tokenizer, checked on PROBES; OptionsError says what to use instead."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise OptionsError(f"{name}'s tokenizer is a slow (Python) tokenizer, whose tokens cannot be read as bytes; "
                           "load the model with its fast tokenizer (tokenizer.json)")
    spell = _piece_reader(json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else {})
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    added = {index: token.content for index, token in tokenizer.added_tokens_decoder.items()}
    pieces = tuple(added[i].encode() if i in added else spell(token) if token else b""
                   for i, token in enumerate(tokens))
    spelling = Spelling(name, pieces, lambda text: tokenizer.encode(text, add_special_tokens=False),
                        tuple(tokenizer.encode("", add_special_tokens=True)))
    for text in PROBES:
        written = spelling.bytes_of(spelling.encode(text))
        if written != text.encode():
            raise OptionsError(f"{name}'s tokenizer does not write text back exactly ({text!r} comes back as "
                               f"{written.decode(errors='replace')!r}), so text cannot move between it and another "
                               "tokenizer; the cross-tokenizer drafter needs byte-level tokenizers on both sides "
                               "(GPT-2-style BPE, or SentencePiece with byte fallback), such as smollm2-135m's and "
                               "qwen2.5-coder's")
    return spelling


def _piece_reader(decoder: dict) -> Callable[[str], bytes]:
    """token string -> bytes, for the tokenizer's decoder (a Sequence of decoders is read as one)."""
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    kinds = {step.get("type") for step in steps}
    if "ByteLevel" in kinds:
        return _byte_level
    swaps = [(step["pattern"].get("String", ""), step["content"]) for step in steps
             if step.get("type") == "Replace" and "String" in step.get("pattern", {})]
    swaps += [(step.get("replacement", "▁"), " ") for step in steps if step.get("type") == "Metaspace"]
    fallback = "ByteFallback" in kinds

    def read(token: str) -> bytes:
        byte = _BYTE_TOKEN.fullmatch(token) if fallback else None
        if byte:
            return bytes([int(byte.group(1), 16)])
        for old, new in swaps:
            token = token.replace(old, new)
        return token.encode()
    return read


def _byte_level(token: str) -> bytes:
    """A byte-level BPE token's bytes: each character of GPT-2's alphabet is one byte (latin-1 writes code points
    below 256 as those bytes); a token outside that alphabet is taken as plain text."""
    try:
        return token.translate(_GPT2_BYTES).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode()


# ---------------------------------------------------------------- the vocabulary intersection

@dataclass(frozen=True)
class SharedPieces:
    """The draft tokens that are also one target token, byte for byte: the only drafts sampling may propose."""

    draft_ids: torch.Tensor  # (S,) long
    target_ids: torch.Tensor  # (S,) long: target_ids[i] has draft_ids[i]'s bytes
    draft_vocab: int  # the draft model's output size (its logits' last dimension)
    target_vocab: int

    def __len__(self) -> int:
        return int(self.draft_ids.numel())

    def draft_mask(self, device: torch.device) -> torch.Tensor:
        """(V_draft,) bool: True for a shared draft token."""
        mask = torch.zeros(self.draft_vocab, dtype=torch.bool)  # (V_draft,)
        mask[self.draft_ids] = True
        return mask.to(device)

    def to_target(self, q: torch.Tensor) -> torch.Tensor:
        """A draft distribution that is zero outside the shared tokens, as a distribution over the target's
        vocabulary: q_target[t] = sum of q over the draft tokens spelled like t. (V_draft,) -> (V_target,)"""
        out = torch.zeros(self.target_vocab, dtype=q.dtype, device=q.device)  # (V_target,)
        return out.index_add_(0, self.target_ids.to(q.device), q[self.draft_ids.to(q.device)])

    def target_of(self, draft_token: int) -> int | None:
        hit = (self.draft_ids == draft_token).nonzero()
        return int(self.target_ids[hit[0, 0]]) if hit.numel() else None


def shared_pieces(draft: Spelling, target: Spelling, draft_vocab: int, target_vocab: int) -> SharedPieces:
    """Pair every draft token with the target token of the same (non-empty) bytes, the lowest id where several."""
    where: dict[bytes, int] = {}
    for token, piece in enumerate(target.pieces[:target_vocab]):
        if piece:
            where.setdefault(piece, token)
    pairs = [(token, where[piece]) for token, piece in enumerate(draft.pieces[:draft_vocab]) if piece in where]
    draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)  # (S,)
    target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)  # (S,)
    return SharedPieces(draft_ids, target_ids, draft_vocab, target_vocab)


# ---------------------------------------------------------------- token healing

@dataclass(frozen=True)
class PrefixIndex:
    """A vocabulary's tokens in byte order, so the tokens whose bytes start with a given prefix are one range.

    Token healing (the draft's side of re-tokenized drafting): a text that ends where the draft's tokenizer would
    have gone on inside one token ("):\n" then "    return" is "):" + "\n   " + " return" to SmolLM2) leaves the draft
    reading a last token it rarely saw followed by what comes next; it then drafts as if the line were over. Holding
    that token back and drafting the first token among those that start with its bytes lets the draft choose the
    longer one."""

    keys: tuple[bytes, ...]  # the non-empty pieces, sorted
    ids: tuple[int, ...]  # the token of each key

    @classmethod
    def of(cls, spelling: Spelling, vocab: int) -> "PrefixIndex":
        order = sorted((piece, token) for token, piece in enumerate(spelling.pieces[:vocab]) if piece)
        return cls(tuple(piece for piece, _ in order), tuple(token for _, token in order))

    def starting_with(self, prefix: bytes) -> list[int]:
        """The tokens whose bytes start with `prefix` (the prefix's own token included)."""
        low, after = bisect.bisect_left(self.keys, prefix), _successor(prefix)
        high = len(self.keys) if after is None else bisect.bisect_left(self.keys, after)
        return list(self.ids[low:high])

    def extends(self, piece: bytes) -> bool:
        """Is some other token's bytes `piece` followed by more?"""
        low = bisect.bisect_right(self.keys, piece)
        return low < len(self.keys) and self.keys[low].startswith(piece)


def _successor(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string that starts with `prefix` (b"\xff" bytes carry); None when
    there is none (the prefix is all b"\xff": its range runs to the end)."""
    head = prefix.rstrip(b"\xff")
    return head[:-1] + bytes([head[-1] + 1]) if head else None


# ---------------------------------------------------------------- committed text, a character at a time

class TextStream:
    """The committed text, fed one token's bytes at a time: whole characters only (a character split across
    tokens waits for its last byte), bytes that are no UTF-8 at all written as U+FFFD, as a decoder would show them.

    `text` is what may be re-encoded by the other tokenizer; `pending` says the text ends inside a character."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = bytearray()  # UTF-8 of the whole characters so far (U+FFFD for invalid bytes)

    def push(self, data: bytes) -> None:
        self.text += self._decoder.decode(data, final=False).encode()

    @property
    def pending(self) -> bool:
        return bool(self._decoder.getstate()[0])


def whole_text(data: bytes) -> str:
    """The whole characters at the start of `data` (a draft's tokens may stop inside one), U+FFFD for bad bytes."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)


def char_start(text: bytes, offset: int) -> int:
    """The nearest character boundary at or before `offset` in UTF-8 `text` (continuation bytes are 10xxxxxx)."""
    while 0 < offset < len(text) and text[offset] & 0xC0 == 0x80:
        offset -= 1
    return offset


def spans(pieces: list[bytes], start: int = 0) -> list[tuple[int, int]]:
    """Byte offsets [start, end) of consecutive pieces, the first starting at `start`."""
    out, at = [], start
    for piece in pieces:
        out.append((at, at + len(piece)))
        at += len(piece)
    return out


def overlapping(span: tuple[int, int], others: list[tuple[int, int]]) -> list[int]:
    """Indices of the spans in `others` that share at least one byte with `span` (an empty span: the one holding
    its offset)."""
    start, end = span
    if start == end:
        return [i for i, (a, b) in enumerate(others) if a <= start < b][:1]
    return [i for i, (a, b) in enumerate(others) if a < end and start < b]
