"""Horizontal bar charts drawn as HTML, for presentation mode.

Plotly sizes its text in pixels fixed when the figure is built, and the server never learns the
browser's viewport, so a Plotly chart cannot have large type on a 1080p projector and still fit
a 720p one. These bars are sized in rem, and presentation mode sets the root font from the
viewport (ui/widgets/presentation.py): the same chart fills the same share of any screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine import Distribution
from ui.views.charts import FINAL_COLOUR, FINAL_NAME, FINAL_STRIPES, RAW_COLOUR, RAW_NAME, bar_rows, final_label
from ui.views.format import esc, pct, quoted, sr_only

BARS_CSS = """
<style>
.tbt-bars{display:grid;grid-template-columns:max-content 1fr;row-gap:.2rem;font-size:1rem;line-height:1.1}
.tbt-bars-label{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre;text-align:right;
 padding:.1rem .5rem .1rem .3rem;align-self:center}
.tbt-bars-track{display:flex;flex-direction:column;justify-content:center;gap:.12rem;padding:.1rem .3rem .1rem 0}
.tbt-bars-bar{display:flex;align-items:center;height:1.05rem;white-space:nowrap;width:calc(100% - 4em)}
.tbt-bars-fill{display:inline-block;height:100%;border-radius:2px;flex:none}
.tbt-bars-value{padding-left:.35rem}
.tbt-bars-pick{background:#fff3bf;color:#212529;font-weight:700}  /* dark text on the light band in either theme */
.tbt-bars-legend{display:flex;flex-wrap:wrap;gap:.2rem 1.2rem;font-size:.9rem;margin-bottom:.35rem}
.tbt-bars-key{display:inline-block;width:1.1rem;height:.8rem;border-radius:2px;margin-right:.3rem}
</style>
"""
# The longest bar takes this share of its box, and its value is written after it; the box leaves
# 4em of the track besides, so on a phone's narrow track too "100.0%" fits beside a full bar
ROOM_FOR_TEXT = 0.78


@dataclass(frozen=True)
class Bar:
    """One bar of a row: its value, the text written after it, its colour (a CSS background:
    a colour, or a colour with a pattern over it)."""

    value: float
    text: str
    colour: str
    name: str = ""  # its series, said to a screen reader before the value (the colour says it on screen)


@dataclass(frozen=True)
class BarRow:
    """A labelled row of one or more bars (one per series)."""

    label: str
    bars: tuple[Bar, ...]
    highlight: bool = False


def _bar_html(bar: Bar, low: float, span: float) -> str:
    """A bar from zero to its value on a track running from `low` to `low + span` (a negative
    value's bar ends at zero)."""
    start = (min(bar.value, 0.0) - low) / span
    length = abs(bar.value) / span
    return (f'<div class="tbt-bars-bar"><span class="tbt-bars-fill" style="margin-left:{100 * start:.2f}%;'
            f'width:{100 * length:.2f}%;background:{bar.colour}"></span>'
            f'<span class="tbt-bars-value">{sr_only(bar.name + ": ") if bar.name else ""}{esc(bar.text)}</span></div>')


def bars_html(rows: Sequence[BarRow], legend: Sequence[tuple[str, str]] = ()) -> str:
    """Rows of labelled bars on one shared scale; `legend` is (colour, name) per series."""
    values = [bar.value for row in rows for bar in row.bars]
    low = min(0.0, *values)
    span = ((max(0.0, *values) - low) or 1.0) / ROOM_FOR_TEXT
    cells = []
    for row in rows:
        pick = " tbt-bars-pick" if row.highlight else ""
        cells.append(f'<div class="tbt-bars-label{pick}">{esc(row.label)}</div><div class="tbt-bars-track{pick}">'
                     + "".join(_bar_html(bar, low, span) for bar in row.bars) + "</div>")
    keys = "".join(f'<span><span class="tbt-bars-key" style="background:{colour}"></span>{esc(name)}</span>'
                   for colour, name in legend)
    return (BARS_CSS + (f'<div class="tbt-bars-legend">{keys}</div>' if keys else "")
            + f'<div class="tbt-bars">{"".join(cells)}</div>')


def distribution_bars_html(distribution: Distribution, pick_id: int | None, top_n: int = 8) -> str:
    """The next-token distribution as the Plotly chart shows it in probability mode: raw softmax
    and final probability per candidate, the pick's row highlighted, one row for all others."""
    rows = bar_rows(distribution, top_n, pick_id)
    final = f"{FINAL_STRIPES},{FINAL_COLOUR}"  # striped as well as orange, as in the Plotly chart
    shown = [BarRow(("▶ " if c.token_id == pick_id else "") + f"#{c.rank} {quoted(c.text)}",
                    (Bar(c.prob, pct(c.prob), RAW_COLOUR, "raw"),
                     Bar(c.final_prob, final_label(c.final_prob), final, "final")),
                    highlight=c.token_id == pick_id)
             for c in rows.shown]
    others = BarRow(f"all other {rows.others_count:,}",
                    (Bar(rows.others_prob, pct(rows.others_prob), RAW_COLOUR, "raw"),
                     Bar(rows.others_final_prob, final_label(rows.others_final_prob), final, "final")))
    picked = any(row.highlight for row in shown)  # a peek or a student's view before the reveal has no pick
    legend = ((RAW_COLOUR, RAW_NAME), (final, FINAL_NAME), *((("#ffe066", "▶ the pick"),) if picked else ()))
    return bars_html([*shown, others], legend)
