"""No import circles among bench/'s modules, nor between app/ and bench/ (issue 34 item 4): the check walks the source
(tests/import_graph.py), so a circle fails here before anything imports."""
from __future__ import annotations

from import_graph import ROOT, cycles, graph


def test_bench_and_app_have_no_import_circle():
    assert cycles(["bench", "app"]) == []


def test_what_the_app_reads_of_bench_never_imports_the_app():
    """The Claims tab reads bench's claims table; nothing it pulls in from bench/ may lead back into app/ (bench's
    scripts that drive the app, bench.load and bench.race_defaults, are leaves no app module imports)."""
    edges = graph(["bench", "app"])
    reached, todo = set(), [b for a, targets in edges.items() if a.startswith("app") for b in targets
                             if b.startswith("bench")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [b for b in edges.get(name, ()) if b.startswith("bench") or b.startswith("app")]
    assert reached and {"bench.claims", "bench.claims_view"} <= reached
    assert sorted(name for name in reached if name.startswith("app")) == []


def test_the_check_finds_a_circle_of_any_length(tmp_path):
    """A three-module circle through a relative import, a `from package import module` and a function-level import
    (the knot bench had: claims -> self_drafters -> __main__ -> report -> claims) is found; a package importing its
    own module is not a circle."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("from pkg import c\nthing = 1\n")
    (package / "c.py").write_text("def later():\n    from pkg.a import thing\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert cycles(["pkg"], tmp_path) == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg.a")]
    (package / "c.py").write_text("def later():\n    return 1\n")
    assert cycles(["pkg"], tmp_path) == []


def test_the_decoders_circles_issue_34_names_are_what_the_check_sees():
    """The same walk over decoders/ (the seams helper's part) names only the circles issue 34 lists, or none once
    they are broken: a check that found nothing there would be suspect."""
    found = {frozenset(edge) for edge in cycles(["decoders"])}
    listed = {frozenset(pair) for pair in [("decoders.registry", "decoders.options"),
                                           ("decoders.registry", "decoders.batch.drafters"),
                                           ("decoders.whisper.options", "decoders.whisper.registry"),
                                           ("decoders.whisper.registry", "decoders.whisper.search")]}
    assert found <= listed, found - listed
    assert (ROOT / "decoders" / "registry.py").is_file()
