"""Small formatting helpers shared by every page: numbers, token text, HTML escaping."""

from __future__ import annotations

import html
import math
import re

from engine import visible  # one drawing of whitespace, the slides' too


def quoted(text: str) -> str:
    """A token for a sentence or a chart label: its visible text in quotes."""
    return f"'{visible(text)}'"


def esc(text: str) -> str:
    """Escape text for HTML."""
    return html.escape(text, quote=True)


# Every character that can start Markdown syntax in Streamlit (CommonMark, GitHub's extensions,
# Streamlit's own :colour[...] and :material/...: directives).
_MARKDOWN_SPECIAL = frozenset("\\`*_{}[]()<>#+-.!|~:$=&\"'")
# GitHub's bare links (https://x, www.x, a@b.c) are found in the text after escapes are read,
# so escaping cannot stop them (measured in Chromium): an invisible word joiner inside the
# pattern does.
_JOINER = "\u2060"
_BARE_LINK = re.compile(r"(?i)(?<=www)(?=\.)|(?=[:@])")


def plain(text: str) -> str:
    """Text shown through Markdown exactly as written: no link, image, emphasis or HTML can
    come from it. For anything a visitor typed or sent (a message quoting it, a file name)."""
    joined = _BARE_LINK.sub(_JOINER, text)
    escaped = "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in joined)
    return escaped.replace("\n", "  \n")  # a line break stays a line break


CHAIN_NAMES = {"transformers": "transformers", "vllm": "vLLM", "llama.cpp": "llama.cpp"}  # as each project writes it


def chain_name(chain: str) -> str:
    """A sampler chain's engine as that project spells its own name."""
    return CHAIN_NAMES.get(chain, chain)


def pct(p: float, digits: int = 1) -> str:
    """A probability as a percentage a student reads at a glance: small values keep significant
    digits instead of 0.0 % (0.04%, 0.0017%), and below a thousandth of a percent the odds are
    written out (1 in 6.2 million), never a percentage in scientific notation."""
    value = 100 * p
    if value == 0:
        return "0%"
    if value < 1e-3:
        return one_in(p)
    if value < 10 ** -digits:
        return f"{value:.{digits}g}%" if value >= 10 ** -(digits + 1) else f"{value:.2g}%"
    return f"{value:.{digits}f}%"


def pct_cell(p: float) -> str:
    """A probability for a narrow table cell: as `pct`, but below a thousandth of a percent
    just "< 0.001%" (the odds do not fit a cell)."""
    return "< 0.001%" if 0 < p < 1e-5 else pct(p)


ODDS_WORDS = ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"))


def one_in(p: float) -> str:
    """A small probability as odds: 1 in 64,000, 1 in 6.2 million, 1 in 20,000 trillion (two digits)."""
    n = 1 / p
    if n >= 1e21:
        return "under 1 in a billion trillion"
    for size, word in ODDS_WORDS:
        if n >= size:
            return f"1 in {_two_digits(n / size)} {word}"
    return f"1 in {_two_digits(n)}"


def _two_digits(x: float) -> str:
    """x to two significant digits, grouped: 6.2, 330, 20,000."""
    rounded = float(f"{x:.2g}")
    return f"{rounded:g}" if rounded < 10 else f"{rounded:,.0f}"


def prob(p: float) -> str:
    """A probability as a decimal with four significant digits (0.7725, 3.98e-05)."""
    if p == 0:
        return "0"
    return f"{p:.4f}" if p >= 0.001 else f"{p:.3g}"


def logp(value: float) -> str:
    """A natural-log probability; -inf when the float32 softmax underflowed to 0."""
    return "−∞" if math.isinf(value) else f"{value:.3f}".replace("-", "−")


def nbytes(count: int) -> str:
    """Bytes in KiB / MiB with the exact count kept for cross-checks elsewhere."""
    if count >= 1024 ** 2:
        return f"{count / 1024 ** 2:.2f} MiB"
    if count >= 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count} B"


def duration(seconds: float) -> str:
    """30 minutes, 1 minute, 3 seconds."""
    value, unit = (seconds / 60, "minute") if seconds >= 60 else (seconds, "second")
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


# Text a screen reader reads and the screen does not show (the usual visually-hidden pattern);
# styled inline so it stays hidden wherever the HTML is drawn, with or without a page's CSS.
SR_ONLY_STYLE = ("position:absolute;width:1px;height:1px;margin:-1px;padding:0;border:0;overflow:hidden;"
                 "clip-path:inset(50%);white-space:nowrap")


def sr_only(text: str, tag: str = "span") -> str:
    """`text` as HTML for a screen reader only."""
    return f'<{tag} class="tbt-sr" style="{SR_ONLY_STYLE}">{esc(text)}</{tag}>'
