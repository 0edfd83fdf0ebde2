"""A step as a slide (engine/slide.py): the size asked for, in the theme asked for, drawn from the
trace (the pick's row and the newest chip in their colours), and a clear refusal of what it cannot draw."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from engine import Generation, SamplerSettings, SettingsError, StopSettings, generation_slide, to_trace
from engine.slide import PALETTES, step_slide


def colour(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture()
def generation(tiny_lm) -> Generation:
    gen = Generation(tiny_lm, "abc abc", sampler=SamplerSettings(temperature=0.9), seed=2,
                     stop=StopSettings(max_new_tokens=4, ignore_eos=True))
    for _ in gen.run():
        pass
    return gen


@pytest.mark.parametrize(("size", "theme"), [((1920, 1080), "light"), ((1280, 720), "dark")])
def test_a_slide_has_the_size_and_theme_asked_and_draws_the_pick_and_the_newest_chip(generation, size, theme) -> None:
    picture = Image.open(io.BytesIO(generation_slide(generation, 2, size, theme)))
    palette = PALETTES[theme]
    assert picture.format == "PNG" and picture.size == size
    colours = {rgb for _, rgb in picture.convert("RGB").getcolors(maxcolors=1 << 20)}
    assert picture.convert("RGB").getpixel((3, 3)) == colour(palette.page)
    assert {colour(palette.pick), colour(palette.newest), colour(palette.raw), colour(palette.final)} <= colours
    assert len(colours) > 50  # text drawn, not a blank page


def test_a_slide_of_a_step_the_generation_does_not_have_is_refused_by_name(generation) -> None:
    with pytest.raises(SettingsError, match="a step of this generation, 1 to 4"):
        generation_slide(generation, 5)
    with pytest.raises(SettingsError, match="1920x1080 or 1280x720"):
        step_slide(to_trace(generation), [], 1, (1000, 500))
    with pytest.raises(SettingsError, match="take a step first"):
        step_slide({"steps": []}, [], None)
