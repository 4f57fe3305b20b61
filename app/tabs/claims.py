"""The Claims tab: the papers' numbers next to ours, read from bench/results/ each time the tab is built."""
from __future__ import annotations

from pathlib import Path

from bench import claims as table


def claims_markdown(results_dir: Path = table.RESULTS) -> str:
    """The same table `python -m bench.claims` writes to bench/CLAIMS.md, built from the results files now."""
    return table.markdown(table.rows(table.load_results(results_dir)))


def build(results_dir: Path = table.RESULTS) -> None:
    import gradio as gr

    from app.shared import glossary

    gr.Markdown(claims_markdown(results_dir), elem_id="sl-claims")
    glossary.build()
