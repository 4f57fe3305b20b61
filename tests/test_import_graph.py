"""No import circles inside decoders/ (issue 34 item 4): the registry knows specs and never reads the options
module; options validate against the spec they look up; decoders/batch builds its forms from the registry, not
the other way round; Whisper's decoder table, options and search policies depend one way. The walker
(tests/import_graph.py) is checked on small made-up packages first, so a green result means something."""
from __future__ import annotations

import textwrap
from pathlib import Path

from import_graph import cycles

ROOT = Path(__file__).resolve().parent.parent


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / next(iter(files)).split("/")[0]


def test_decoders_has_no_import_circle():
    assert cycles([ROOT / "decoders"]) == []


def test_the_walker_finds_a_circle_through_a_lazy_or_type_only_import(tmp_path):
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/options.py": "from . import registry\n",
        "pkg/registry.py": """\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .options import Options
            def build():
                from .batch.drafters import build
            """,
        "pkg/batch/__init__.py": "",
        "pkg/batch/drafters.py": "def f():\n    from ..registry import drafter\n",
    })
    assert cycles([pkg]) == [("pkg.batch.drafters", "pkg.registry"), ("pkg.options", "pkg.registry"),
                             ("pkg.registry", "pkg.batch.drafters"), ("pkg.registry", "pkg.options")]


def test_the_walker_follows_a_package_s_init_and_circles_of_three(tmp_path):
    """registry imports batch.forms, which runs batch/__init__.py, which imports batch.run, which imports registry:
    no two modules import each other, yet importing registry first breaks."""
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "from .api import generate\n",  # a package importing its own modules: no circle alone
        "pkg/api.py": "from .registry import DRAFTERS\ndef generate(): pass\n",
        "pkg/registry.py": "from .batch.forms import FORMS\nDRAFTERS = {}\n",
        "pkg/batch/__init__.py": "from .run import build\n",
        "pkg/batch/forms.py": "FORMS = {}\n",
        "pkg/batch/run.py": "from .. import registry\nfrom . import forms\ndef build(): pass\n",
    })
    assert cycles([pkg]) == [("pkg.batch", "pkg.batch.run"), ("pkg.batch.run", "pkg.registry"),
                             ("pkg.registry", "pkg.batch")]


def test_the_walker_passes_a_one_way_package(tmp_path):
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "from .options import Options\nfrom . import registry\n",
        "pkg/options.py": "from .registry import spec\nimport pkg.errors\n",
        "pkg/registry.py": "from pkg.errors import OptionsError\nfrom .sub import thing\n",
        "pkg/errors.py": "class OptionsError(ValueError): pass\n",
        "pkg/sub/__init__.py": "from .thing import thing\n",
        "pkg/sub/thing.py": "from .. import errors\nfrom . import other\nthing = 1\n",
        "pkg/sub/other.py": "import os\n",
    })
    assert cycles([pkg]) == []
