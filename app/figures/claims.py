"""The Claims tab's HTML (pure): one headline table, one row per claim, then each claim's history folded in a
<details>. The words come from bench/claims_view.py, the same ones bench/CLAIMS.md prints; every cell carries a
title (hover) that says what its number means. On a phone (CLAIMS_CSS) each row becomes a card of labelled fields
and the command column is dropped, so no column is squeezed to a letter's width."""
from __future__ import annotations

from html import escape

from bench import claims_view as words
from bench.claim_types import ClaimRow


def _cell(tag: str, cell: words.Cell, label: str, css: str = "") -> str:
    text, sub, hover = cell
    klass = f' class="{css}"' if css else ""
    small = f'<span class="sl-claims-sub">{_inline(sub)}</span>' if sub else ""
    body = _inline(text)
    if label == "ratio" and " the paper&#x27;s " in body:  # keep "2–2.5×" in one piece
        ours, figure = body.split(" the paper&#x27;s ", 1)
        body = f'{ours} the paper&#x27;s <span class="sl-claims-figure">{figure}</span>'
    return f'<{tag}{klass} data-label="{escape(label)}" title="{escape(hover)}">{body}{small}</{tag}>'


def _inline(text: str) -> str:
    """Escaped text with `code` spans as <code> (the shared words mark commands that way)."""
    parts = escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _row(cells: dict[str, words.Cell], columns, first_is_header: bool = False, css: dict | None = None) -> str:
    out = []
    for i, column in enumerate(columns):
        tag = "th" if first_is_header and i == 0 else "td"
        out.append(_cell(tag, cells[column], column, (css or {}).get(column, "")))
    return "<tr>" + "".join(out) + "</tr>"


def _head(columns, css: dict | None = None) -> str:
    cells = "".join(f'<th scope="col" class="{(css or {}).get(c, "")}">{escape(c)}</th>' for c in columns)
    return f"<thead><tr>{cells}</tr></thead>"


def headline_table(table: list[ClaimRow]) -> str:
    rows = "".join(_row(words.headline_cells(row), words.HEADLINE_COLUMNS, first_is_header=True) for row in table)
    return (f'<div class="sl-claims-wrap"><table class="sl-claims-table sl-claims-headline">'
            f"{_head(words.HEADLINE_COLUMNS)}<tbody>{rows}</tbody></table></div>")


_COMMAND = {"command (results file)": "sl-claims-command"}  # dropped on a phone (CLAIMS_CSS)


def history(row: ClaimRow) -> str:
    """One claim folded: the paper, why ours differs, the headline run, then every other measurement."""
    claim, n = row.claim, len(row.history)
    summary = f"{claim.method}: the paper, why ours differs, " + (
        f"{n} more measurement{'s' if n != 1 else ''}" if n else "no other measurement")
    body = [f"<p><b>The paper:</b> {_inline(f'{claim.claim} ({claim.paper}; {claim.setting}).')}</p>",
            f"<p><b>Why ours differs:</b> {_inline(claim.why_more)}</p>",
            f"<p><b>Headline run:</b> {_inline(words.headline_run(row))}</p>"]
    if row.history:
        rows = "".join(_row(words.history_cells(row, m, lambda text: f"`{text}`"), words.HISTORY_COLUMNS,
                            css=_COMMAND) for m in row.history)
        body.append(f'<div class="sl-claims-wrap"><table class="sl-claims-table sl-claims-history">'
                    f"{_head(words.HISTORY_COLUMNS, _COMMAND)}<tbody>{rows}</tbody></table></div>")
    return f"<details><summary>{escape(summary)}</summary>{''.join(body)}</details>"


def claims_html(table: list[ClaimRow]) -> str:
    """The whole tab: title, how to read it, the headline table, then each claim folded with its history."""
    return (f'<div class="sl-claims"><h2>{escape(words.TITLE)}</h2><p class="sl-claims-lead">'
            f"{_inline(words.LEAD)}</p>{headline_table(table)}<h3>Each claim in full</h3>"
            f'<p class="sl-claims-intro">{_inline(words.INTRO)}</p>'
            + "".join(history(row) for row in table) + "</div>")


CLAIMS_CSS = """
#sl-claims .sl-claims-wrap { overflow-x: auto; max-width: 100%; }
#sl-claims .sl-claims-lead { margin: 4px 0 10px; }
#sl-claims .sl-claims-table { border-collapse: collapse; width: 100%; font-size: 14px; margin: 0; }
#sl-claims .sl-claims-table th, #sl-claims .sl-claims-table td { border: 0;
    border-bottom: 1px solid var(--border-color-primary, #ddd); padding: 6px 8px; text-align: left;
    vertical-align: top; overflow-wrap: anywhere; cursor: help; }
#sl-claims .sl-claims-table td { min-width: 7em; }
#sl-claims .sl-claims-headline tbody th { min-width: 8em; font-weight: 600; }
#sl-claims .sl-claims-figure { white-space: nowrap; }
#sl-claims .sl-claims-sub { display: block; font-size: 12px; opacity: 0.75; margin-top: 2px; }
#sl-claims .sl-claims-table code { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; }
#sl-claims details { border-bottom: 1px solid var(--border-color-primary, #ddd); padding: 6px 0; }
#sl-claims summary { cursor: pointer; font-weight: 600; }
@media (max-width: 640px) {
  #sl-claims .sl-claims-table thead { display: none; }
  #sl-claims .sl-claims-table, #sl-claims .sl-claims-table tbody, #sl-claims .sl-claims-table tr,
  #sl-claims .sl-claims-table th, #sl-claims .sl-claims-table td { display: block; width: auto; min-width: 0; }
  #sl-claims .sl-claims-table tr { border-bottom: 2px solid var(--border-color-primary, #ccc); padding: 6px 0; }
  #sl-claims .sl-claims-table th, #sl-claims .sl-claims-table td { border: 0; padding: 2px 8px; }
  #sl-claims .sl-claims-table td::before { content: attr(data-label); display: block; font-size: 11px;
      font-weight: 600; text-transform: uppercase; opacity: 0.65; }
  #sl-claims .sl-claims-command { display: none !important; }
}
"""
