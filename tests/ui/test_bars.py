"""Presentation mode's HTML bars: one shared scale, negative values drawn left of zero."""

from __future__ import annotations

import re

from ui.views.bars import ROOM_FOR_TEXT, Bar, BarRow, bars_html


def geometry(html: str) -> list[tuple[float, float]]:
    """(margin-left %, width %) of every bar, in order."""
    return [(float(a), float(b)) for a, b in re.findall(r"margin-left:([\d.]+)%;width:([\d.]+)%", html)]


def test_the_longest_bar_leaves_room_for_its_value_and_the_others_share_its_scale():
    html = bars_html([BarRow("a", (Bar(0.5, "50%", "#000"),)), BarRow("b", (Bar(0.25, "25%", "#000"),))])
    assert geometry(html) == [(0.0, 100 * ROOM_FOR_TEXT), (0.0, 50 * ROOM_FOR_TEXT)]


def test_a_negative_value_ends_at_zero_and_a_positive_one_starts_there():
    html = bars_html([BarRow("up", (Bar(3.0, "3", "#000"),)), BarRow("down", (Bar(-1.0, "-1", "#000"),))])
    (up_start, up_width), (down_start, down_width) = geometry(html)
    zero = 100 * ROOM_FOR_TEXT / 4  # the track runs from -1 to 3, scaled to leave room for text
    assert round(up_start, 2) == round(zero, 2) and round(down_start + down_width, 2) == round(zero, 2)
    assert round(up_width / down_width, 2) == 3.0


def test_the_highlighted_row_is_marked_and_labels_are_escaped():
    html = bars_html([BarRow("<pick>", (Bar(1.0, "100%", "#000"),), highlight=True)])
    assert html.count("tbt-bars-pick") == 3  # the CSS rule, the label and the track
    assert "&lt;pick&gt;" in html and "<pick>" not in html
