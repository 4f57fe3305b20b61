"""The Claims tab: the papers' numbers next to ours, read from bench/results/ each time the tab is built."""
from __future__ import annotations

from pathlib import Path

from app.figures.claims import claims_html
from bench import claims as table


def claims_page(results_dir: Path = table.RESULTS) -> str:
    """The tab's HTML: the same headline table and histories `python -m bench.claims` writes to bench/CLAIMS.md."""
    return claims_html(table.table(table.load_results(results_dir)))


def claims_markdown(results_dir: Path = table.RESULTS) -> str:
    """bench/CLAIMS.md as it would be written from the results files now."""
    return table.markdown(table.table(table.load_results(results_dir)))


def build(results_dir: Path = table.RESULTS) -> None:
    import gradio as gr

    from app.shared import glossary

    gr.HTML(claims_page(results_dir), elem_id="sl-claims")
    glossary.build()
