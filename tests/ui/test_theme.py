"""Light and dark: every chart's text and the custom HTML's page colours read at WCAG AA
against the page of their theme, and chart backgrounds let the page show through."""

from __future__ import annotations

import pytest
import torch

import ui.views.teaching_charts as teaching
from engine.speed import CachePoint
from tests.contrast import contrast
from ui.views.theme import CLEAR, DARK, LIGHT, PAGE_COLOURS, ChartTheme, theme_css
from ui.widgets.theme import current_theme

BACKGROUNDS = {"light": ("#ffffff", "#f8f8f7"), "dark": ("#171614", "#2d2b27")}  # Streamlit's page, secondary


@pytest.mark.parametrize("theme", [LIGHT, DARK], ids=lambda t: t.name)
def test_chart_text_and_reference_lines_read_at_4_5_to_1_on_their_themes_page(theme: ChartTheme) -> None:
    assert contrast(theme.text, theme.page) >= 4.5
    assert contrast(theme.muted, theme.page) >= 4.5


@pytest.mark.parametrize("name", ["light", "dark"])
def test_the_custom_htmls_text_colours_read_at_4_5_to_1_on_either_background_of_their_theme(name: str) -> None:
    for role in ("muted", "ok", "bad", "bonus", "accent"):
        for background in BACKGROUNDS[name]:
            assert contrast(PAGE_COLOURS[name][role], background) >= 4.5, (role, background)


@pytest.mark.parametrize("name", ["light", "dark"])
def test_a_boxed_cells_text_reads_on_its_box_and_the_box_is_the_themes_own(name: str) -> None:
    colours = PAGE_COLOURS[name]
    assert contrast(colours["cell-ink"], colours["cell"]) >= 4.5
    page = BACKGROUNDS[name][0]  # a dark theme's cell is dark too: no light box glaring on a dark page
    assert (contrast(colours["cell"], "#000000") > contrast(colours["cell"], "#ffffff")) == (name == "light")
    assert contrast(colours["cell"], page) < 1.6


def test_theme_css_sets_the_variables_of_the_theme_asked_for_and_inside_the_app_either_by_its_scheme() -> None:
    css = theme_css(DARK)
    root, inside = css.split("@supports", 1)
    assert f"--tbt-muted:{PAGE_COLOURS['dark']['muted']}" in root
    assert PAGE_COLOURS["light"]["muted"] not in root
    for key, light in PAGE_COLOURS["light"].items():  # the app's own scheme picks, whatever the script thought
        assert f"--tbt-{key}:light-dark({light},{PAGE_COLOURS['dark'][key]})" in inside
    assert current_theme() is LIGHT  # outside a Streamlit run: light


def test_a_teaching_chart_in_dark_has_clear_backgrounds_and_the_dark_themes_text() -> None:
    points = [CachePoint(context_tokens=n, cached_ms=1.0, recompute_ms=n / 10) for n in (16, 64)]
    figure = teaching.ratio_figure(points, theme=DARK)
    layout = figure.layout
    assert layout.paper_bgcolor == layout.plot_bgcolor == CLEAR
    assert layout.font.color == layout.xaxis.tickfont.color == layout.yaxis.title.font.color == DARK.text
    assert figure.data[0].textfont.color == DARK.text  # the value labels
    assert all(shape.line.color == DARK.muted for shape in layout.shapes)


def test_a_lesson_chart_in_light_keeps_the_light_themes_text() -> None:
    figure = teaching.top_values_figure(["a", "b"], torch.tensor([0.6, 0.3]).tolist(), "t", "p")
    assert figure.layout.font.color == LIGHT.text
