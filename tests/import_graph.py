"""Which modules import each other in a circle, read from the source (an AST walk: nothing is imported).

    from import_graph import cycles
    assert cycles(["bench", "app"]) == []

Every import counts, wherever it is written (module top, inside a function, under `if TYPE_CHECKING:`): a function
that imports its caller's module is still a circle a reader has to hold in mind, and moving an import into a
function to dodge Python's import order hides one instead of breaking it. Edges between a package and its own
modules (a package's `__init__` re-exporting what its modules define) are not circles of the design and are left
out, as in the before-stop hook's check.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path = ROOT) -> str:
    """bench/claims.py -> "bench.claims"; app/tabs/race/__init__.py -> "app.tabs.race"."""
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def modules(package_dirs: list[str], root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every .py file under the given package folders."""
    return {module_name(path, root): path for folder in package_dirs for path in sorted((root / folder).rglob("*.py"))}


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that the file at `path` (module `name`) imports, by absolute or relative import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb level-1 packages from this module's own package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return {_owner(target, known) for target in found if _owner(target, known)}


def _owner(target: str, known: dict[str, Path]) -> str | None:
    """The known module an import names: itself, or the module that defines the imported attribute."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def graph(package_dirs: list[str], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules it imports, within the given packages (imports from elsewhere are left out)."""
    known = modules(package_dirs, root)
    edges = {}
    for name, path in known.items():
        edges[name] = {b for b in imports(path, name, known) if not _related(name, b)}
    return edges


def _related(a: str, b: str) -> bool:
    """A module and itself, or a package and one of its own modules."""
    return a == b or b.startswith(a + ".") or a.startswith(b + ".")


def cycles(package_dirs: list[str], root: Path = ROOT) -> list[tuple[str, str]]:
    """Every import (a, b) that lies on a circle: a imports b and b leads back to a. Empty when there is none."""
    edges = graph(package_dirs, root)
    reach = {name: _reachable(edges, name) for name in edges}
    return sorted((a, b) for a, targets in edges.items() for b in targets if a in reach[b])


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
