"""Code hygiene a newcomer relies on: every document the code cites is in the repository, and no package exports a
name that shadows one of its submodules."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for folder in ("decoders", "app", "bench") for p in (ROOT / folder).rglob("*.py")]
CITED = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w.-]+\.md)\b")  # a repository path to a Markdown file
# Cited results a bench run in flight writes (another branch, merged separately); each entry says which run.
PENDING: dict[str, str] = {}  # a citation whose file a running benchmark is about to write (none now)
OUTSIDE = re.compile(r"\.\./shared|shared/research|(?<![\w/])algorithms\.md|performance_anchors|research §")


def test_every_cited_document_is_in_the_repository():
    missing = [f"{path.relative_to(ROOT)}: {cited}" for path in SOURCES
               for cited in CITED.findall(path.read_text()) if not (ROOT / cited).is_file() and cited not in PENDING]
    assert missing == []


def test_no_comment_points_outside_the_repository():
    outside = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in SOURCES
               for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert outside == []


def test_the_checks_above_can_fail():
    assert CITED.findall("see docs/nowhere.md §2") == ["docs/nowhere.md"] and not (ROOT / "docs/nowhere.md").exists()
    assert OUTSIDE.search("see ../shared/research/whisper.md §2.10") and OUTSIDE.search("(algorithms.md §6.1)")
    assert not OUTSIDE.search("(docs/algorithms.md §6.1)")


def test_no_package_attribute_shadows_its_submodule():
    """`decoders.beams` once exported its function `dsbd`, so `import decoders.beams.dsbd` yielded the function."""
    import decoders

    shadowed = []
    for info in pkgutil.walk_packages(decoders.__path__, "decoders."):
        parent_name, _, child = info.name.rpartition(".")
        if child.startswith("_") or child == "__main__":
            continue
        parent = importlib.import_module(parent_name)
        if hasattr(parent, child) and not inspect.ismodule(getattr(parent, child)):
            shadowed.append(info.name)
    assert shadowed == []
    import decoders.beams.dsbd as module

    assert inspect.ismodule(module) and callable(module.dsbd)
