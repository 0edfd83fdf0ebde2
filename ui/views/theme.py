"""The visitor's theme, light or dark, for the pieces Streamlit does not colour itself.

Streamlit follows the visitor's system setting (or the choice in its settings menu) and tells
the script which it is in `st.context.theme.type` (ui/widgets/theme.py reads it). Charts take
their text, grid and highlight colours from the `ChartTheme` of that type (passed in by the
caller) and leave their backgrounds transparent, so the page shows through; text colours are
chosen for at least 4.5:1 against the page in each theme.
Custom HTML (chips, bars, tables) draws dark text on its own light backgrounds, which reads in
both themes, and takes text that sits on the page itself (notes, accept/reject marks) from the
CSS variables that `theme_css` sets for the visitor's theme: no grey reads at 4.5:1 on both a
white and a near-black page.
"""

from __future__ import annotations

from dataclasses import dataclass

CLEAR = "rgba(0,0,0,0)"


@dataclass(frozen=True)
class ChartTheme:
    """The colours of a chart's non-data parts in one theme."""

    name: str
    text: str  # titles, tick and value labels, legends: ≥ 4.5:1 on `page`
    muted: str  # reference lines and their notes: ≥ 4.5:1 on `page`
    grid: str
    zeroline: str
    page: str  # Streamlit's background in this theme, seen through the transparent plot
    band: str  # the highlight behind the pick's row
    band_opacity: float


LIGHT = ChartTheme("light", text="#31333f", muted="#495057", grid="#e9ecef", zeroline="#999999",
                   page="#ffffff", band="#ffe066", band_opacity=0.45)
DARK = ChartTheme("dark", text="#fafafa", muted="#ced4da", grid="#3a3d4a", zeroline="#808495",
                  page="#171614", band="#ffd43b", band_opacity=0.25)

# Text on the page's own background in the custom HTML, per theme, each ≥ 4.5:1 on Streamlit's
# page and secondary background there (light #ffffff / #f8f8f7, dark #171614 / #2d2b27):
# notes and legends, accepted / rejected / bonus marks, rules between rows, the slider's values.
# "ok" is a blue-green, not a green: red and green text look alike to a red-green colour-blind
# eye (tests/ui/test_colour_vision.py simulates it); the marks carry ✓ and ✗ besides.
# "cell" and "cell-ink": a small boxed value (the logit lens's layer cells) and its text, a box a
# step off the page in each theme rather than a light box glaring on a dark page.
PAGE_COLOURS = {
    "light": {"muted": "#5f5b57", "ok": "#0b7285", "bad": "#b02525", "bonus": "#6741d9", "rule": "#dee2e6",
              "accent": "#9e303b", "cell": "#f1f3f5", "cell-ink": "#212529", "cell-rule": "#c9ced6"},
    "dark": {"muted": "#b8b3a8", "ok": "#66d9e8", "bad": "#f2919a", "bonus": "#bf8ef7", "rule": "#4a4742",
             "accent": "#f2919a", "cell": "#2d2b27", "cell-ink": "#fafafa", "cell-rule": "#5c5852"},
}
# Streamlit's own pieces under 4.5:1: captions (faded body text, 3.9:1 in either theme), the
# slider's values and a selected segment's label (its primary colour: 3.6-4.5:1)
STREAMLIT_FIXES = ("[data-testid='stCaptionContainer'],[data-testid='stCaptionContainer'] p"
                   "{color:var(--tbt-muted);opacity:1}"
                   "[data-testid='stSliderThumbValue'],[data-testid='stButtonGroup'] [data-selected='true'] p"
                   "{color:var(--tbt-accent)}")
# Focus always visible on the keyboard: Streamlit rings its buttons, but not its links, text fields,
# switches or the main area, which a Tab also reaches; they get a ring in the accent colour
FOCUS_CSS = ("a:focus-visible,main:focus-visible,[role=option]:focus-visible{outline:2px solid var(--tbt-accent)"
             "!important;outline-offset:-2px}"
             "textarea:focus-visible,input:not([role=switch]):not([type=checkbox]):focus-visible"
             "{outline:2px solid var(--tbt-accent)!important;outline-offset:-2px}"
             "label:has(input[role=switch]:focus-visible),label:has(input[type=checkbox]:focus-visible)"
             "{outline:2px solid var(--tbt-accent);outline-offset:2px;border-radius:4px}")


# Inside the app the colours follow Streamlit's own theme at once: Streamlit marks its app's
# colour scheme, and light-dark() picks by it. The script's idea of the theme (`theme` below) can
# lag a switch until a whole run (Streamlit's issue 11920), and a fragment's run (a Step) leaves
# this style as it was; it stays for what Streamlit draws outside the app (menus, popovers).
FOLLOWS_THE_APP = ("@supports (color:light-dark(#000,#fff)){[data-testid='stApp']{"
                   + ";".join(f"--tbt-{key}:light-dark({light},{PAGE_COLOURS['dark'][key]})"
                              for key, light in PAGE_COLOURS["light"].items())
                   + "}}")


def theme_css(theme: ChartTheme) -> str:
    """A style element setting the custom HTML's `--tbt-*` colours for `theme` (and, inside the
    app, for whichever theme it shows), the fixes to Streamlit's own colours, and a visible focus
    ring wherever Streamlit draws none."""
    return f"<style>:root{{{theme_variables(theme.name)}}}{FOLLOWS_THE_APP}{STREAMLIT_FIXES}{FOCUS_CSS}</style>"


def theme_variables(name: str) -> str:
    """The custom HTML's `--tbt-*` colours of the theme called `name`, as CSS declarations."""
    return ";".join(f"--tbt-{key}:{value}" for key, value in PAGE_COLOURS[name].items())


def layout_colours(theme: ChartTheme) -> dict:
    """Layout properties that colour a figure for `theme` (transparent paper and plot area)."""
    text = {"color": theme.text}
    return {"paper_bgcolor": CLEAR, "plot_bgcolor": CLEAR, "font": text,
            "title": {"font": text}, "legend": {"font": text, "bgcolor": CLEAR}}


def axis_colours(theme: ChartTheme) -> dict:
    """Axis properties for `theme`: grid and zero lines, tick labels and the title."""
    text = {"color": theme.text}
    return {"gridcolor": theme.grid, "zerolinecolor": theme.zeroline, "linecolor": theme.zeroline,
            "tickfont": text, "title": {"font": text}}
