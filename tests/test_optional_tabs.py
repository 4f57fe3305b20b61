"""A missing optional piece costs its own tab, never the page (app/shared/optional.py): with openai-whisper hidden,
build_demo still builds every tab, the Whisper tab and the Learn tab's Whisper lesson say what is missing and how to
install it, and the Claims tab still renders (its one Whisper-normalised detail says why it is left out)."""
from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def without_whisper(monkeypatch):
    for name in [n for n in sys.modules if n == "whisper" or n.startswith("whisper.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "whisper", None)  # `import whisper` fails, find_spec says not installed


def test_missing_names_the_module_and_the_fix(without_whisper):
    from app.shared.optional import missing, missing_message

    assert missing("whisper", "json") == ["whisper"]
    message = missing_message(["whisper"], "The Whisper tab")
    assert "pip install openai-whisper==" in message and "the rest of the page works" in message


def test_the_page_builds_and_the_whisper_tab_explains_itself(without_whisper):
    from app.page import build_demo

    config = build_demo().get_config_file()
    texts = [str((c.get("props") or {}).get("value")) for c in config["components"]]
    notes = [t for t in texts if "Not available here" in t]
    assert any("The Whisper tab needs `whisper`" in t for t in notes)
    assert any("This lesson needs `whisper`" in t for t in notes)
    labels = [(c.get("props") or {}).get("label") for c in config["components"]]
    assert "Speech (wav, flac, ogg, mp3)" not in labels  # the tab's controls were not built half-way
    claims = next(t for c, t in zip(config["components"], texts) if (c.get("props") or {}).get("elem_id") == "sl-claims")
    assert "<table" in claims


def test_a_tab_whose_build_fails_to_import_explains_itself():
    import gradio as gr

    from app.shared.optional import build_or_explain

    def build():
        import a_module_nobody_installed  # noqa: F401

    with gr.Blocks() as demo:
        assert build_or_explain("The Example tab", (), build) is None
    texts = [str((c.get("props") or {}).get("value")) for c in demo.get_config_file()["components"]]
    assert any("The Example tab needs `a_module_nobody_installed`" in t for t in texts)
