"""Not colour alone, and colours that survive colour blindness: every pair of colours that tells
two things apart (raw / final, kept / rejected, setting A / B / C, one engine's chain from
another) stays distinguishable when simulated as a protanope or a deuteranope sees it, and the
chips' probability shading stays a ramp from light to dark.

The simulation is Machado, Oliveira and Fernandes (2009), "A Physiologically-based Model for
Simulation of Color Vision Deficiency", severity 1.0: one 3x3 matrix per deficiency applied to
linear RGB. Distinguishable means a CIE76 colour difference (ΔE*ab) of at least MIN_DELTA_E
after the simulation: about a fifth of the way from black to white in lightness, well past the
2-3 units at which two large patches stop looking the same.
"""

from __future__ import annotations

from itertools import combinations, pairwise

import pytest

from ui.views.breaking_the_chain import KIND_COLOURS, REJECTED_COLOUR
from ui.views.charts import FINAL_COLOUR, RAW_COLOUR
from ui.views.chips import _SCALE
from ui.views.teaching_charts import CACHED_COLOUR, CHAIN_COLOURS, RECOMPUTE_COLOUR, SETTING_COLOURS
from ui.views.theme import PAGE_COLOURS

MIN_DELTA_E = 20.0
MACHADO = {  # severity 1.0, rows map linear (R, G, B) to the simulated linear R, G, B
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
}
VISIONS = ("normal", *MACHADO)

# The pairs that carry meaning, named by where a student sees them
PAIRS = {
    "raw / final distribution": (RAW_COLOUR, FINAL_COLOUR),
    "light theme: kept ✓ / rejected ✗ mark": (PAGE_COLOURS["light"]["ok"], PAGE_COLOURS["light"]["bad"]),
    "dark theme: kept ✓ / rejected ✗ mark": (PAGE_COLOURS["dark"]["ok"], PAGE_COLOURS["dark"]["bad"]),
    "guess kept / guess rejected chip": (KIND_COLOURS["accepted"], REJECTED_COLOUR),
    "guess kept / replacement chip": (KIND_COLOURS["accepted"], KIND_COLOURS["replaced"]),
    "guess kept / bonus chip": (KIND_COLOURS["accepted"], KIND_COLOURS["bonus"]),
    "replacement / bonus chip": (KIND_COLOURS["replaced"], KIND_COLOURS["bonus"]),
    "KV: cached / recompute": (CACHED_COLOUR, RECOMPUTE_COLOUR),
    **{f"sampler lab: raw / setting {'ABC'[i]}": (RAW_COLOUR, c) for i, c in enumerate(SETTING_COLOURS)},
    **{f"sampler lab: setting {'ABC'[i]} / {'ABC'[j]}": (SETTING_COLOURS[i], SETTING_COLOURS[j])
       for i, j in combinations(range(len(SETTING_COLOURS)), 2)},
    **{f"chain order: {a} / {b}": (CHAIN_COLOURS[a], CHAIN_COLOURS[b]) for a, b in combinations(CHAIN_COLOURS, 2)},
}


def _linear(colour: str) -> tuple[float, float, float]:
    channels = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return tuple(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)


def simulate(colour: str, vision: str) -> tuple[float, float, float]:
    """The linear RGB a viewer with `vision` perceives for `colour` ('#rrggbb'), clipped to the gamut."""
    rgb = _linear(colour)
    if vision == "normal":
        return rgb
    return tuple(min(1.0, max(0.0, sum(m * c for m, c in zip(row, rgb, strict=True)))) for row in MACHADO[vision])


def lab(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """CIELAB (D65 white) of a linear sRGB colour."""
    r, g, b = rgb
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           0.0193 * r + 0.1192 * g + 0.9505 * b)
    white = (0.95047, 1.0, 1.08883)
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29
         for t in (v / w for v, w in zip(xyz, white, strict=True))]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def delta_e(a: str, b: str, vision: str) -> float:
    """CIE76 ΔE*ab between two colours as `vision` sees them."""
    return sum((x - y) ** 2 for x, y in zip(lab(simulate(a, vision)), lab(simulate(b, vision)), strict=True)) ** 0.5


def test_the_simulation_leaves_greys_alone_and_merges_a_pink_and_a_green_for_a_deuteranope() -> None:
    for grey in ("#000000", "#777777", "#ffffff"):
        for vision in MACHADO:
            assert delta_e(grey, grey, "normal") == 0
            assert lab(simulate(grey, vision)) == pytest.approx(lab(_linear(grey)), abs=0.2)
    # the rejected chip's old pink beside the kept chip's green: far apart for most eyes, alike for a deuteranope
    assert delta_e("#b2f2bb", "#ffc9c9", "normal") > 50
    assert delta_e("#b2f2bb", "#ffc9c9", "deuteranopia") < 10


@pytest.mark.parametrize("vision", VISIONS)
@pytest.mark.parametrize("pair", list(PAIRS))
def test_every_meaningful_pair_of_colours_stays_apart_under_colour_blindness(pair: str, vision: str) -> None:
    a, b = PAIRS[pair]
    assert delta_e(a, b, vision) >= MIN_DELTA_E, f"{pair}: {a} / {b} as {vision} sees them"


@pytest.mark.parametrize("vision", VISIONS)
def test_the_chips_probability_shading_stays_a_light_to_dark_ramp(vision: str) -> None:
    lightness = [lab(simulate(colour, vision))[0] for colour in _SCALE]
    steps = [before - after for before, after in pairwise(lightness)]
    assert min(steps) >= 5, (vision, [round(v) for v in lightness])
