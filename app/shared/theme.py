"""Colours, marks, labels and number formats shared by every view, so a status looks the same in the text, the
tree and the legend.

Colours are Okabe & Ito's colour-blind-safe palette (Color Universal Design, 2008), and colour is never the only
channel: every token provenance also has its own underline style and every tree status its own marker symbol.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

# Okabe-Ito: distinguishable under protanopia, deuteranopia and tritanopia.
OKABE_ITO = {"orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7", "black": "#000000"}

# Tree node statuses (decoders/trace.py NODE_STATUS) plus the target's own token (bonus / resampled / baseline).
# The four provenance colours are the Okabe-Ito set that stays most distinct at the text's 50% tint under simulated
# protanopia, deuteranopia and tritanopia (tests/test_render.py checks it); a rejected draft is a black cross.
STATUS_COLORS = {
    "root": "#4c4c4c",
    "accepted": OKABE_ITO["bluish green"],
    "rejected": OKABE_ITO["black"],
    "not_reached": "#c7c7c7",
    "bonus": OKABE_ITO["yellow"],
    "resampled": OKABE_ITO["vermillion"],
    "baseline": OKABE_ITO["sky blue"],
}
# The second channel in the tree: drafts are circles (rejected: a cross, not reached: hollow), the target's own
# token a diamond (replacement: crossed, plain target step: hollow).
STATUS_SYMBOLS = {"root": "circle", "accepted": "circle", "rejected": "x", "not_reached": "circle-open",
                  "bonus": "diamond", "resampled": "diamond-x", "baseline": "diamond-open"}
STATUS_LABELS = {  # short: the tree's legend wraps into few lines at phone width
    "root": "pending (root)",
    "accepted": "accepted",
    "rejected": "rejected",
    "not_reached": "not reached",
    "bonus": "bonus (target)",
    "resampled": "replacement (target)",
    "baseline": "target step",
}
# HighlightedText labels = token provenance (decoders/trace.py PROVENANCE).
PROVENANCE_COLORS = {k: STATUS_COLORS[k] for k in ("accepted", "resampled", "bonus", "baseline")}
# The second channel: a CSS text-decoration style per provenance (readable without any colour vision).
PROVENANCE_UNDERLINES = {"accepted": "solid", "resampled": "wavy", "bonus": "double", "baseline": "dotted"}
PROVENANCE_NAMES = {"accepted": "accepted draft", "resampled": "target's replacement", "bonus": "bonus (target)",
                    "baseline": "plain target step"}
PROVENANCE_HELP = {
    "accepted": "a draft token the target accepted (free: no target step of its own)",
    "resampled": "the target's replacement after it rejected a draft",
    "bonus": "the target's extra token after it accepted every draft of the round",
    "baseline": "a plain target step: the baseline, or a round without any draft",
}
ROUND_MARK = "outline: 2px solid #000; outline-offset: 1px; font-weight: 700;"  # the shown round's tokens


def visible_token(text: str, limit: int = 16) -> str:
    """Token text with whitespace made visible, shortened for node labels."""
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣")
    if not shown:
        shown = "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


# What the marks in token labels stand for (visible_token makes whitespace visible; the tokenizer's own "�" is a token
# that holds only part of a character's UTF-8 bytes, the rest coming in the next token).
TOKEN_MARKS = {"␣": "a space", "↵": "a line break", "⇥": "a tab", "∅": "an empty token",
               "�": "part of a multi-byte character (the rest is in the next token)"}


def token_key() -> str:
    """One line that explains every mark a token label can show."""
    return "; ".join(f"{mark} = {meaning}" for mark, meaning in TOKEN_MARKS.items())


def marks_in(label: str) -> str:
    """The meanings of the marks that appear in one label ("" when it has none), for a hover."""
    return "; ".join(f"{mark} = {meaning}" for mark, meaning in TOKEN_MARKS.items() if mark in label)


def sig(value: float | None, digits: int = 3) -> str:
    """A number for people: `digits` significant digits, scientific below 1e-3 so small probabilities never read
    as 0.000; "—" for a missing value."""
    if value is None:
        return "—"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:#.{digits}g}".rstrip(".") if abs(value) < 10 ** digits else f"{value:.0f}"


def wrap_title(text: str, width: int = 44) -> str:
    """Break a plot title into lines of at most `width` characters (plotly never wraps), at " · " first, then at
    spaces, so it stays inside a phone-width plot."""
    lines: list[str] = []
    for part in text.split(" · "):
        joined = f"{lines[-1]} · {part}" if lines else part
        if lines and len(joined) <= width:
            lines[-1] = joined
            continue
        lines += _wrap_words(part, width)
    return "<br>".join(lines)


def hover_lines(lines: list[str], width: int = 48) -> str:
    """A hover box's lines joined, each after the first (which may hold a <b> tag around spaces) wrapped at `width`
    characters: plotly never wraps a hover, and a long line runs off a phone-width plot."""
    return "<br>".join(lines[:1] + [wrapped for line in lines[1:] for wrapped in _wrap_words(line, width)])


def _wrap_words(text: str, width: int) -> list[str]:
    lines = [""]
    for word in text.split(" "):
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return lines


def title_margin(title: str) -> int:
    """Top margin (px) that fits a wrapped 14 px title above the plot area."""
    return 24 + 18 * (title.count("<br>") + 1)


def legend_below(**extra) -> dict:
    """A horizontal legend along the figure's bottom edge. Placed in the container (yref), plotly reserves its height
    below the x-axis title; at a negative paper y it sat over the title once it wrapped onto more lines (a phone)."""
    return dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom", **extra)


def describe(fig, summary: str):
    """Attach a plain-text summary to a figure (layout.meta); the page's script turns it into the plot's
    aria-label, so a screen reader gets what the picture shows."""
    fig.update_layout(meta=summary)
    return fig


def rgba(hex_color: str, alpha: float) -> str:
    """'#RRGGBB' -> 'rgba(r, g, b, a)', spelled the way Gradio writes a HighlightedText token's background."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def provenance_css(scope: str = "#sl-text") -> str:
    """Underline each output token by its provenance. Gradio marks a token only by its background colour
    (the colour map at alpha 0.5), so the rule keys on that."""
    return "".join(f'{scope} .token[style*="{rgba(color, 0.5)}"] {{ text-decoration: underline '
                   f'{PROVENANCE_UNDERLINES[name]} #222; text-decoration-thickness: 2px; '
                   f'text-underline-offset: 3px; }}\n' for name, color in PROVENANCE_COLORS.items())


# The page's CSS beyond the views' own: the output text's marks and the responsive layout. The Generate tab is a
# grid of four cells (prompt and Run, the examples, the result, the options): on a wide screen the result sits
# beside the other three; on a narrow one everything stacks with the result straight after Run. Side-by-side
# plots wrap onto their own lines before they get too narrow.
NARROW = 860  # px: below this the Generate tab is one column
PLOT_MIN = 360  # px: two plots in a row wrap below this width each
PAGE_CSS = provenance_css() + f"""
#sl-text {{ font-size: 15px; line-height: 1.9; }}
#sl-text .token-container {{ margin: 0 !important; }}
#sl-text .token {{ margin: 1px 0 !important; padding: 0 1px !important; border-radius: 3px !important;
                  white-space: pre-wrap; }}
#sl-text .token:focus-visible {{ outline: 3px solid {OKABE_ITO["blue"]}; outline-offset: 2px; }}
#sl-text .textfield {{ gap: 0 !important; }}
.sl-legend {{ font-size: 13px; }}
.sl-key {{ display: inline-block; margin-right: 12px; cursor: help; }}
.sl-swatch {{ padding: 0 3px; border-radius: 3px; }}
.sl-swatch-round {{ {ROUND_MARK} }}
.sl-note {{ font-size: 12.5px; margin: 4px 0 0; opacity: 0.85; }}
#sl-main {{ display: grid !important; grid-template-columns: minmax(320px, 1fr) minmax(0, 2fr);
           grid-template-areas: "run out" "ex out" "opts out"; grid-template-rows: auto auto 1fr;
           align-items: start; }}
#sl-run-col {{ grid-area: run; }}
#sl-examples {{ grid-area: ex; }}
#sl-outputs {{ grid-area: out; min-width: 0 !important; }}
#sl-options {{ grid-area: opts; }}
@media (max-width: {NARROW}px) {{
  #sl-main {{ grid-template-columns: minmax(0, 1fr); grid-template-areas: "run" "out" "ex" "opts";
             grid-template-rows: auto; }}
}}
/* A plot's block label floats over the plot's top-left corner, where plotly draws the title: put it above instead. */
.block:has(.js-plotly-plot) > label[data-testid="block-label"].float {{ position: static !important;
    display: inline-flex; margin: 0 0 4px 0; }}
/* The contents picker of the Learn tab: one lesson per line on a phone, so every lesson is a tap away. */
@media (max-width: {NARROW}px) {{ #sl-lesson-list .wrap {{ flex-direction: column; align-items: stretch; }} }}
/* ... which makes the lessons' own tab strip redundant there: hidden, it no longer folds lessons behind a "⋯". */
@media (max-width: {NARROW}px) {{ #sl-lessons > .tab-wrapper {{ display: none; }} }}
/* Eleven lessons in one row at 1280 px: their tabs a little tighter than the page's own. */
#sl-lessons > .tab-wrapper [role=tab], #sl-lessons > .tab-wrapper > .tab-container.visually-hidden > button {{
    padding-left: 8px !important; padding-right: 8px !important; }}  /* the hidden copy is what Gradio measures */
#sl-rule-row, #sl-race-plots, #sl-race-setup > .form {{ flex-wrap: wrap !important; }}
#sl-rule-row > *, #sl-race-plots > *, #sl-race-setup > .form > * {{ flex: 1 1 {PLOT_MIN}px !important;
                                                                  min-width: min({PLOT_MIN}px, 100%) !important; }}
/* A dropdown's long value (a recorded run's name at 420 px) ends in "…" before its arrow, never under it. */
.secondary-wrap > input[role="combobox"] {{ min-width: 0; text-overflow: ellipsis; }}
.secondary-wrap:has(> .icon-wrap) > input[role="combobox"] {{ padding-right: 26px !important; }}
/* An empty coloured-text panel (Batch before a run) showed Gradio's "empty" icon, which reads as a broken image. */
.block:has(> .empty[aria-label="Empty value"]) .empty .icon {{ display: none; }}
#bt-row-text .empty::after {{ content: "No row yet: run a batch, then pick a row to read its text here.";
    font-size: 14px; color: var(--body-text-color-subdued, #666); padding: 0 16px; text-align: center; }}
"""

# Runs once on page load (launch(js=...)), and again (debounced) whenever Gradio redraws part of the page:
# - each plot gets its figure's summary (layout.meta, see `describe`) as role="figure" + aria-label;
# - each tab strip follows the ARIA tabs pattern: Left/Right (and Home/End) move to the previous/next tab and open it,
#   and only the selected tab is in the Tab order (a roving tabindex);
# - each wide box (`scroll_box`) says whether it overflows, so its "swipe for more" cue and edge shadow show only then.
PAGE_JS = """
() => {
  const label = () => document.querySelectorAll('.js-plotly-plot').forEach((div) => {
    const summary = div.layout && div.layout.meta;
    if (typeof summary === 'string' && div.getAttribute('aria-label') !== summary) {
      div.setAttribute('role', 'figure');
      div.setAttribute('aria-label', summary);
    }
  });
  const tabsOf = (list) => [...list.querySelectorAll(':scope > [role=tab], :scope > * > [role=tab]')]
    .filter((tab) => !tab.disabled && tab.offsetParent !== null);
  const rove = () => document.querySelectorAll('[role=tablist]').forEach((list) => tabsOf(list).forEach((tab) => {
    const index = tab.getAttribute('aria-selected') === 'true' ? '0' : '-1';
    if (tab.getAttribute('tabindex') !== index) tab.setAttribute('tabindex', index);
  }));
  const measure = () => document.querySelectorAll('.sl-scroll').forEach((box) => {
    const inner = box.querySelector('.sl-scroll-x');
    if (!inner) return;
    box.toggleAttribute('data-overflows', inner.scrollWidth > inner.clientWidth + 1);
    box.toggleAttribute('data-at-end', inner.scrollLeft + inner.clientWidth >= inner.scrollWidth - 1);
  });
  // Plot toolbars stay usable by mouse but leave the Tab order: ten buttons per plot put the controls 40 to 60 Tab
  // presses past Run (issue 47.6); the plots' own data is in their aria-label (label above).
  const untab = () => document.querySelectorAll('.modebar button, .modebar a, .modebar-btn').forEach((b) => {
    if (b.getAttribute('tabindex') !== '-1') b.setAttribute('tabindex', '-1');
  });
  const refresh = () => { label(); rove(); measure(); untab(); };
  // A slider's number box keeps a value outside its range when it loses focus (Gradio's own blur handler clamps it,
  // so Run ran T = 2 for a typed 100): the server then refuses it in words (app/shared/boxes.py).
  window.addEventListener('blur', (event) => {
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || box.type !== 'number' || box.value === '' ||
        box.closest('.sl-scrubber') || !(box.getAttribute('aria-label') || '').startsWith('number input for ')) return;
    const value = Number(box.value);
    if ((box.min !== '' && value < Number(box.min)) || (box.max !== '' && value > Number(box.max))) {
      event.stopImmediatePropagation();
    }
  }, true);
  document.addEventListener('keydown', (event) => {
    const tab = event.target.closest && event.target.closest('[role=tab]');
    const list = tab && tab.closest('[role=tablist]');
    if (!list || !['ArrowRight', 'ArrowLeft', 'Home', 'End'].includes(event.key)) return;
    const tabs = tabsOf(list), at = tabs.indexOf(tab);
    const next = {ArrowRight: tabs[(at + 1) % tabs.length], ArrowLeft: tabs[(at - 1 + tabs.length) % tabs.length],
                  Home: tabs[0], End: tabs[tabs.length - 1]}[event.key];
    event.preventDefault();
    next.click();
    next.focus();
    requestAnimationFrame(rove);
  });
  document.addEventListener('scroll', (event) => {
    if (event.target.classList && event.target.classList.contains('sl-scroll-x')) measure();
  }, true);
  window.addEventListener('resize', measure);
  let queued = false;
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; refresh(); }); }
  }).observe(document.body, { childList: true, subtree: true, attributes: true, attributeFilter: ['aria-selected'] });
  refresh();
}
"""


def scroll_box(inner: str, what: str = "columns") -> str:
    """Wrap a wide table: it scrolls sideways inside its own box, and when it does not fit (a phone) a line above it
    says so and a shadow marks the edge with more (PAGE_JS sets data-overflows; PAGE_CSS shows the cue)."""
    return (f'<div class="sl-scroll"><div class="sl-scroll-cue" aria-hidden="true">swipe or scroll sideways for more '
            f'{what} →</div><div class="sl-scroll-x" tabindex="0" role="region" aria-label="table: scrolls sideways">'
            f'{inner}</div></div>')


SCROLL_CSS = """
.sl-scroll-x { overflow-x: auto; max-width: 100%; }
.sl-scroll-cue { display: none; font-size: 12px; color: #555; margin: 2px 0 4px; }
.sl-scroll[data-overflows] .sl-scroll-cue { display: block; }
.sl-scroll[data-overflows]:not([data-at-end]) .sl-scroll-x { box-shadow: inset -14px 0 10px -10px rgba(0, 0, 0, 0.45); }
"""


def empty_figure(message: str, height: int = 300, width: int = 40) -> go.Figure:
    """A figure that only says something; the message is wrapped so it fits a half-width or phone-width plot."""
    fig = go.Figure()
    fig.add_annotation(text=wrap_title(message, width), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=13, color="#555"))
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=20, b=10))
    return describe(fig, message)


# Why a run ended, in words (decoders write the identifiers: loop.py, beams/search.py, beams/dsbd.py).
STOP_WORDS = {"eos": "finished at end-of-sequence", "max_new_tokens": "reached the max new tokens",
              "cancelled": "stopped by the user", "context": "stopped at the context limit"}


def stop_words(reason: str | None) -> str:
    """A stop reason as a person would say it; an identifier not in STOP_WORDS keeps its words, never underscores."""
    return STOP_WORDS.get(reason or "", str(reason or "").replace("_", " "))
