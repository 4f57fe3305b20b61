"""A draft model with a tokenizer of its own (universal assisted generation: transformers' `assistant_model` with
`tokenizer` and `assistant_tokenizer`). Any small model drafts for any target; the loop and the verification core
are the ones every drafter uses.

The draft decodes in its own tokens, with its own KV cache, over its own encoding of the committed text. A round:
1. sync: the committed text (the target's ids as bytes, decoders/retokenize.py) is held against the draft tokens
   in the draft's cache. Those that still spell it are kept, minus the last LOOKBEHIND: those and everything after
   them are encoded again from text, since a boundary the draft drew may merge with what the target went on to
   commit (" hel" then "lo" is " hello" to a tokenizer). The cache drops what it no longer holds.
   Token healing, temperature 0: when longer draft tokens start with the bytes of the text's last draft token, the
   same forward also gives the logits before it; if the draft's best token there is one of those longer ones, the
   last token goes back out of the cache and that token is the first draft (retokenize.PrefixIndex). "):\n" then
   four spaces is "):" + "\n   " + " return" to SmolLM2; a draft that reads a bare "\n" drafts an unindented line.
2. draft: up to `limit` tokens in the draft's vocabulary, the draft-length rule judging each position.
3. hand over. Temperature 0: the drafted text (whole characters) is encoded by the target's tokenizer, and greedy
   verification needs only the target's argmax. Temperature > 0: the draft samples only among its tokens that are
   one target token with the same bytes (retokenize.SharedPieces), so each draft is one target token and q moves
   onto the target's vocabulary: recursive rejection sampling in decoders/verify.py is then exact.
The round's two tokenizations go in Proposal.retokenized (the trace's `retokenized`, decoders/trace.py).
"""
from __future__ import annotations

from typing import Iterator

import torch

from ..errors import OptionsError
from ..retokenize import (PrefixIndex, SharedPieces, Spelling, TextStream, overlapping, shared_pieces, spans,
                          spelling_of, whole_text)
from ..runtime.runner import CachedModel
from ..tree import DraftTree, Flavor
from .base import Drafter, DraftStop, Proposal, draft_position

LOOKBEHIND = 2  # draft tokens encoded again from text each round (transformers' UAG looks back 10 target tokens)


class CrossTokenizerDrafter(Drafter):
    name = "cross-tokenizer"

    def __init__(self, model: torch.nn.Module, draft: Spelling, target: Spelling, eos_ids=(), target_eos_ids=(),
                 shared: SharedPieces | None = None):
        self.runner = CachedModel(model)
        self.draft, self.target = draft, target
        self.eos_ids, self.target_eos = set(eos_ids), set(target_eos_ids)
        self.shared = shared  # sampling: drafts only among these (None at temperature 0: re-tokenized)
        # Token healing at temperature 0 only: a sampled draft is one target token each, none may cover committed text
        self.prefixes = PrefixIndex.of(draft, _vocab(model)) if shared is None else None
        self.held = b""  # this round's healed bytes: the committed text's last ones, which the first draft repeats
        if shared is not None:
            self.outside = ~shared.draft_mask(self.runner.device)  # (V_draft,) True where no target token matches
            as_target = torch.full((shared.draft_vocab,), -1, dtype=torch.long)  # (V_draft,)
            as_target[shared.draft_ids] = shared.target_ids
            self.as_target = as_target.tolist()
        self.committed = TextStream()  # the committed text, whole characters
        self.seen = 0  # target ids folded into self.committed
        self.fed: list[int] = []  # the draft tokens in the draft's cache, in order
        self.ends: list[int] = []  # where each fed token ends, in bytes of the committed text (then of the drafts)
        self.trusted = 0  # fed[:trusted] are known to spell the committed text
        self.context_fed = 0  # tokens fed to bring the cache up to the committed text, over the run

    @classmethod
    def from_context(cls, ctx) -> "CrossTokenizerDrafter":
        """The registry's build (decoders/registry.py): both models' tokenizers, the vocabulary intersection when
        the run samples."""
        target, draft = _spelling(ctx.target, "target"), _spelling(ctx.draft, "draft")
        shared = None
        if ctx.options.temperature > 0:
            shared = shared_pieces(draft, target, _vocab(ctx.draft.model), _vocab(ctx.runner.model))
            if len(shared) == 0:
                raise OptionsError(f"draft {ctx.draft.name} and target {ctx.target.name} spell no token alike, so "
                                   "no draft can be sampled exactly for the target; use temperature 0 (the draft's "
                                   "text is then re-tokenized for the target) or a draft that shares tokens")
        return cls(ctx.draft.model, draft, target, ctx.draft.eos_token_ids, ctx.target.eos_token_ids, shared)

    # ---------------------------------------------------------------- the draft's context

    def start(self, ids: list[int], features=None) -> None:
        for _ in self.start_steps(ids):
            pass

    def start_steps(self, ids: list[int], features=None) -> Iterator[int]:
        """Read the prompt's text in the draft's own tokens, all but the last (the first round feeds it), in the
        runner's prefill chunks as the target does, so Stop lands between two. Yields after each chunk how far it
        got, in the target's prompt tokens (what the trace's prefill line counts): the share of the draft's read."""
        synced = self._sync(ids)
        if not synced or len(synced[0]) <= 1:
            return
        tokens, ends = synced[0][:-1], synced[1][:-1]
        total = len(ids) - 1
        done = 0
        for read, _ in self.runner.prefill(tokens):
            self.fed += tokens[done:read]  # the cache holds them now: a stop after this chunk leaves both in step
            self.ends += ends[done:read]
            self.context_fed += read - done
            self.trusted, done = len(self.fed), read
            yield total if read == len(tokens) else total * read // len(tokens)

    def _sync(self, ids: list[int]) -> tuple[list[int], list[int]] | None:
        """Drop the cache back to the draft tokens that still spell the committed text (less LOOKBEHIND) and return
        the context tokens to feed after them with their ends: at least one token, so that a forward gives the
        logits after the whole text, and two when the last one may be healed (`self.held` its bytes, _catch_up).
        None when the text ends inside a character (the target's tokens split it)."""
        for token in ids[self.seen:]:
            self.committed.push(self.target.piece(token))
        self.seen = len(ids)
        if self.committed.pending:
            return None
        text = bytes(self.committed.text)
        head = len(self.draft.start)  # a BOS of the draft's own: fed first, spells nothing, always kept
        if len(self.fed) < head:  # the first sync: the whole text after the draft's own start
            back, offset, tail = 0, 0, list(self.draft.start) + self.draft.encode(text.decode())
        else:
            back = max(head, self._spelled(text) - LOOKBEHIND)
            while back > head and not _boundary(text, self.ends[back - 1]):  # encode again from a whole character
                back -= 1
            offset = self.ends[back - 1] if back > head else 0
            tail = self.draft.encode(text[offset:].decode())
        context = self.fed[:back] + tail
        if not context:
            return None
        same = next((i for i, (a, b) in enumerate(zip(self.fed[back:], tail)) if a != b),
                    min(len(tail), len(self.fed) - back))
        hold = self._heals(context, head)
        keep = min(back + same, len(context) - 1 - hold)
        ends = self.ends[:back] + _ends(self.draft, tail, offset, len(text), head if back == 0 else 0)
        self.runner.drop_last(len(self.fed) - keep)  # also every round's crop point for sliding-window drafts
        self.fed, self.ends = self.fed[:keep], self.ends[:keep]
        self.trusted = keep
        self.held = self.draft.piece(context[-1]) if hold else b""
        return context[keep:], ends[keep:]

    def _heals(self, context: list[int], head: int) -> int:
        """1 if the context's last token may be healed: greedy, a token of the text (not the draft's BOS) after
        another token, and longer draft tokens that start with its bytes; else 0."""
        last = len(context) - 1
        return int(self.prefixes is not None and last >= max(head, 1) and
                   self.prefixes.extends(self.draft.piece(context[last])))

    def _spelled(self, text: bytes) -> int:
        """How many fed tokens spell the committed text from its start: the trusted ones, then drafted ones while
        each one's bytes are the text's next bytes."""
        count = self.trusted
        at = self.ends[count - 1] if count else 0
        while count < len(self.fed):
            piece = self.draft.piece(self.fed[count])
            if not piece or text[at:at + len(piece)] != piece:
                break
            at += len(piece)
            count += 1
        return count

    def _feed(self, tokens: list[int], ends: list[int]) -> torch.Tensor:
        """Append tokens to the draft's cache (ends: where each ends in the text); the logits after the last."""
        logits = self.runner.forward(tokens, last_only=True)[-1]  # (V_draft,)
        self.fed += tokens
        self.ends += ends
        return logits

    def _catch_up(self, tokens: list[int], ends: list[int]) -> torch.Tensor:
        """Feed the context tokens; the logits for the first draft. Token healing: when the draft's best token
        before the last context token is a longer one with the same first bytes, that last token leaves the cache
        and the logits before it, kept to those tokens, are the first draft's (else self.held is cleared)."""
        if not self.held:
            return self._feed(tokens, ends)
        rows = self.runner.forward(tokens)  # (n, V_draft): the logits after each fed token, n >= 2
        self.fed += tokens
        self.ends += ends
        healed = self._healed(rows[-2])  # (V_draft,)
        if self.draft.piece(int(healed.argmax())) == self.held:  # the draft writes that token itself: no healing
            self.held = b""
            return rows[-1]
        self.runner.drop_last(1)
        self.fed, self.ends = self.fed[:-1], self.ends[:-1]
        return healed

    # ---------------------------------------------------------------- a round

    def propose(self, ids, limit, rule, warp, generator, record) -> Proposal:
        root = DraftTree.root_only(ids[-1])
        if limit <= 0:
            return Proposal(root, reason=DraftStop.BUDGET)
        synced = self._sync(ids)
        if synced is None:
            return Proposal(root, reason=DraftStop.MID_CHARACTER)
        kept = len(self.fed)
        logits = self._catch_up(*synced)  # (V_draft,)
        self.context_fed += len(synced[0])
        self.trusted = len(self.fed)
        own = Proposal(DraftTree.root_only(self.fed[-1]), forwards=1)  # the draft's chain, in its own tokens
        drafted: list[int] = []
        for position in range(1, limit + 1):
            if self.shared is not None:  # sampling: only tokens the target spells alike
                logits = logits.masked_fill(self.outside, float("-inf"))  # (V_draft,)
            token = draft_position(own, position, logits, rule, warp, generator, record)
            if token is None:
                break
            drafted.append(token)
            if token in self.eos_ids or self._target_eos(token):
                own.reason = DraftStop.EOS
                break
            if position < limit:
                logits = self._feed([token], [self.ends[-1] + len(self.draft.piece(token))])  # (V_draft,)
                own.forwards += 1
        tree = self._shared_tree(ids[-1], own) if self.shared is not None else \
            _chain(ids[-1], self._retokenize(ids[-1], drafted, limit))
        proposal = Proposal(tree, forwards=own.forwards, checks=own.checks, reason=own.reason)
        if record:
            proposal.retokenized = self._record(drafted, tree, kept, len(synced[0]))
        return proposal

    def _healed(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with every token that does not start with the healed bytes at -inf. (V_draft,)"""
        allowed = torch.tensor(self.prefixes.starting_with(self.held), device=logits.device)  # (A,)
        out = torch.full_like(logits, float("-inf"))  # (V_draft,)
        out[allowed] = logits[allowed]
        return out

    def _target_eos(self, token: int) -> bool:
        return self.shared is not None and self.as_target[token] in self.target_eos

    def _shared_tree(self, pending: int, own: Proposal) -> DraftTree:
        """Sampling: each draft token is the target token of the same bytes, drawn from q moved onto the target's
        vocabulary (zero outside the shared tokens), so the chain verifies exactly."""
        tree = DraftTree.root_only(pending)
        for node in range(1, own.tree.size):
            tree.add(node - 1, self.as_target[own.tree.tokens[node]], own.tree.q_token[node])
            tree.q_dists[node - 1] = self.shared.to_target(own.tree.q_dists[node - 1])  # (V_target,)
        return tree

    def _retokenize(self, pending: int, drafted: list[int], limit: int) -> list[int]:
        """Greedy: the target's tokens for the drafted text (whole characters), encoded after the pending token
        where that token survives the joint encoding (else alone), at most `limit`, none after an EOS."""
        text = whole_text(self.draft.bytes_of(drafted)[len(self.held):])  # less the healed bytes (committed text)
        if not text:
            return []
        tokens = self.target.encode(text)
        lead = self.target.piece(pending)
        try:
            joint = self.target.encode(lead.decode() + text)
            if joint[:1] == [pending]:
                tokens = joint[1:]
        except UnicodeDecodeError:  # the pending token ends a character it did not start: encode the text alone
            pass
        tokens = tokens[:limit]
        end = next((i for i, token in enumerate(tokens) if token in self.target_eos), None)
        return tokens if end is None else tokens[:end + 1]

    def _record(self, drafted: list[int], tree: DraftTree, kept: int, fed: int) -> dict:
        """Both tokenizations of the round, for the trace (decoders/trace.py `retokenized`)."""
        pieces = [self.draft.piece(token) for token in drafted]
        piece_spans = spans(pieces, start=-len(self.held))  # a healed first piece starts in the committed text
        node_spans = spans([self.target.piece(token) for token in tree.tokens[1:]])
        sent = node_spans[-1][1] if node_spans else 0
        return {"mode": "shared" if self.shared is not None else "retokenized", "draft": self.draft.name,
                "target": self.target.name,
                "pieces": [{"id": token, "text": piece.decode("utf-8", "backslashreplace"), "start": a, "end": b}
                           for token, piece, (a, b) in zip(drafted, pieces, piece_spans)],
                "nodes": [{"node": i + 1, "start": a, "end": b, "pieces": overlapping((a, b), piece_spans)}
                          for i, (a, b) in enumerate(node_spans)],
                "unsent": b"".join(pieces)[len(self.held) + sent:].decode("utf-8", "backslashreplace"),
                "context": {"kept": kept, "fed": fed, "healed": self.held.decode("utf-8", "backslashreplace")}}

    def summary(self) -> dict:
        return {"cross_tokenizer": {"mode": "shared" if self.shared is not None else "retokenized",
                                    "draft_tokenizer": self.draft.name, "target_tokenizer": self.target.name,
                                    "shared_tokens": len(self.shared) if self.shared is not None else None,
                                    "context_tokens_fed": self.context_fed}}

    def kv_peak_bytes(self) -> int:
        return self.runner.peak_bytes

    def close(self) -> None:
        self.runner.release()


def _chain(pending: int, tokens: list[int]) -> DraftTree:
    """Re-tokenized drafts: a chain of target tokens with no q of their own (they were encoded, not drawn)."""
    tree = DraftTree.root_only(pending)
    tree.flavor = Flavor.DETERMINISTIC
    for token in tokens:
        tree.add(tree.size - 1, token)
    return tree


def _boundary(text: bytes, offset: int) -> bool:
    """Does a character start at `offset` (or the text end there)? UTF-8 continuation bytes are 10xxxxxx."""
    return offset >= len(text) or text[offset] & 0xC0 != 0x80


def _ends(draft: Spelling, tail: list[int], offset: int, length: int, start: int) -> list[int]:
    """Where each tail token ends in the committed text: the tail spells text[offset:] after `start` tokens of the
    draft's own (a BOS spells nothing). Cut at the text's end, which the last token ends: a tokenizer that
    normalizes (NFC) may write other bytes than it read."""
    ends, at = [], offset
    for i, token in enumerate(tail):
        at = at if i < start else min(at + len(draft.piece(token)), length)
        ends.append(at)
    if ends:
        ends[-1] = length
    return ends


def _spelling(lm, role: str) -> Spelling:
    tokenizer = getattr(lm, "tokenizer", None)
    if tokenizer is None:
        raise OptionsError(f"the cross-tokenizer drafter turns the draft's text into the target's tokens, so the "
                           f"{role} model needs its tokenizer, and {getattr(lm, 'name', role)} came without one; load "
                           "it with decoders.runtime.models.load_model (or give the object a .tokenizer)")
    return spelling_of(tokenizer, getattr(lm, "name", role))


def _vocab(model: torch.nn.Module) -> int:
    """The size of the model's logits (its config's vocab_size; a multimodal config keeps it in text_config)."""
    config = model.config
    return (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size
