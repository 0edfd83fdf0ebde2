"""WCAG 2.1 contrast, for the tests that check text colours (tests/ui, tests/browser)."""

from __future__ import annotations

from collections.abc import Sequence


def rgb(colour: str) -> tuple[int, int, int]:
    """'#rrggbb' as 0-255 channels."""
    value = colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


def luminance(channels: Sequence[float]) -> float:
    """WCAG 2.1 relative luminance of an sRGB colour (0-255 channels)."""
    def linear(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in channels[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: Sequence[float] | str, bg: Sequence[float] | str) -> float:
    """WCAG 2.1 contrast ratio, 1 to 21, of two colours ('#rrggbb' or 0-255 channels)."""
    fg, bg = (rgb(c) if isinstance(c, str) else c for c in (fg, bg))
    light, dark = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (light + 0.05) / (dark + 0.05)
