"""What a tab needs beyond the page itself, and what the tab says when that is missing.

A Space installs requirements.txt, which holds everything; a local venv or a trimmed image may still lack a piece
(openai-whisper, say). A missing piece costs its own tab, never the page: build_demo builds every tab through
build_or_explain, and a tab whose modules are missing (or whose build fails to import something) becomes a panel
that names what is missing and how to install it. Handlers that import lazily turn the same ImportError into the
same sentence (missing_message), so a run never shows a traceback either.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

from app.shared.errors import log_handled

WHISPER = ("whisper", "jiwer")  # openai-whisper (model, decoders, text normaliser) and jiwer (WER)
# import name -> (what pip installs, pinned as in requirements.txt)
PACKAGES = {"whisper": "openai-whisper==20250625", "jiwer": "jiwer==4.0.0", "networkx": "networkx==3.6.1",
            "plotly": "plotly==7.1.0"}


def missing(*modules: str) -> list[str]:
    """The modules of `modules` that cannot be found (none imported: finding is enough to decide, and cheap)."""
    gone = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-removed package
            found = False
        if not found:
            gone.append(module)
    return gone


def missing_message(modules: list[str], what: str) -> str:
    """One sentence: what is missing, what it costs and the fix."""
    installs = " ".join(PACKAGES.get(module, module) for module in modules)
    names = ", ".join(f"`{module}`" for module in modules)
    return (f"{what} needs {names}, which is not installed on this server, so it is switched off here; the rest "
            f"of the page works. To turn it on: `pip install {installs}` (it is in requirements.txt), then restart "
            "the app.")


def build_or_explain(what: str, needs: tuple[str, ...], build: Callable[[], object]):
    """build() when every module of `needs` is there and its imports succeed; otherwise a panel saying what is
    missing (and None instead of build()'s result)."""
    import gradio as gr

    gone = missing(*needs)
    if not gone:
        try:
            return build()
        except ImportError as err:  # something it imports at build time is missing or broken
            gone = [err.name or str(err)]
    message = missing_message(gone, what)
    log_handled(what, message)
    gr.Markdown(f"**Not available here.** {message}", elem_classes=["sl-missing"])
    return None
