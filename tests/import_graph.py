"""Which modules of SpecLab's packages import each other in a circle, read from the source (nothing is imported).

Every import counts, wherever it stands: at the top, inside a function (a lazy import only postpones the circle)
or under `if TYPE_CHECKING:` (a type the two sides share still ties them together). Names resolve the way Python
resolves them, packages included: `from . import registry` in decoders/options.py is an edge to decoders.registry,
not to the package decoders; `from .x import y` in a package's __init__.py is relative to that package; `import
a.b.c` and `from a.b import c` reach the deepest scanned module the name denotes. Importing a.b.c runs a/__init__.py
and a/b/__init__.py first, so those are edges too: decoders.registry importing decoders.batch.drafters depends on
decoders/batch/__init__.py and on whatever that imports. A package's __init__ importing its own submodules is an
edge; a module "importing" a package it lies in is not (Python has run that __init__ already, and counting it
would put every package on a circle with its own modules).

    cycles(["decoders", "bench", "app"]) -> [("decoders.options", "decoders.registry"), ...]

lists every edge (a imports b) that lies on a circle, i.e. where b also reaches a through the edges, so circles of
any length show, not only two modules importing each other.
"""
from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """decoders/whisper/search.py -> decoders.whisper.search; decoders/batch/__init__.py -> decoders.batch."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan(package_dirs: list[str | Path]) -> dict[str, Path]:
    """Every module under the given package folders, by dotted name (named from each folder's parent)."""
    found = {}
    for folder in map(Path, package_dirs):
        folder = folder.resolve()
        for path in sorted(folder.rglob("*.py")):
            found[module_name(path, folder.parent)] = path
    return found


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The module a `from ... import` names, with its dots resolved against the importing module `name`."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if is_package else name.split(".")[:-1]  # a package's __init__ is its own package
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _deepest(dotted: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of `dotted` that is a scanned module (a.b.function -> a.b)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The scanned modules that module `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, is_package)
            targets = [f"{base}.{alias.name}" for alias in node.names]  # a submodule, or a name in `base`
        else:
            continue
        found |= {hit for hit in (_deepest(target, known) for target in targets) if hit is not None}
    found |= {package for hit in found for package in _packages_above(hit) if package in known}
    return {hit for hit in found if not (name == hit or name.startswith(hit + "."))}


def _packages_above(dotted: str) -> list[str]:
    """a.b.c -> [a, a.b]: the __init__ files Python runs before a.b.c."""
    parts = dotted.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def graph(package_dirs: list[str | Path]) -> dict[str, set[str]]:
    known = scan(package_dirs)
    return {name: imports(name, path, known) for name, path in known.items()}


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(package_dirs: list[str | Path]) -> list[tuple[str, str]]:
    """Every import edge (a, b) on a circle: a imports b, and b reaches a again."""
    edges = graph(package_dirs)
    reach = {name: _reach(edges, name) for name in edges}
    return sorted((a, b) for a, targets in edges.items() for b in targets if a in reach[b])


if __name__ == "__main__":
    import sys

    for a, b in cycles(sys.argv[1:] or ["decoders"]):
        print(f"{a} -> {b}")
