"""The three teaching pages in a real browser: reached from the sidebar, one after another in
one visitor's tab, they render, answer their controls, and leave screenshots in test-artifacts/
for a person to look at."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.browser.conftest import ARTIFACTS, app_tab
from tests.browser.runs import SLOW, settle

pytestmark = pytest.mark.browser


def open_page(page, title: str) -> None:
    """Go to a page the way a visitor does: its link in the sidebar."""
    page.get_by_role("link", name=title).click()
    page.get_by_role("heading", name=re.compile(title)).first.wait_for(timeout=SLOW)


def click_to_heading(page, button: str, heading: str) -> None:
    """Click a button and wait until the heading it leads to is drawn and the run is over."""
    page.get_by_role("button", name=button).click()
    page.get_by_role("heading", name=heading).wait_for(timeout=SLOW)
    settle(page)


@pytest.fixture(scope="module")
def page(browser, app_url) -> Iterator:
    """Here one tab (not conftest's fresh one a test) visits the three pages in turn, as a student
    does: each is reached from the sidebar in a state of its own."""
    tab = app_tab(browser, app_url)
    yield tab
    tab.context.close()


def shoot(page, name: str, height: int = 2400) -> None:
    page.set_viewport_size({"width": 1280, "height": height})
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    page.set_viewport_size({"width": 1280, "height": 800})


def test_sampler_lab_shows_three_samplers_and_draws_a_thousand_times(page):
    open_page(page, "Sampler lab")
    page.get_by_text("Three samplers on the same logits").wait_for(timeout=SLOW)
    picks = page.locator("[data-testid='stMetricLabel']", has_text="picks")
    picks.nth(2).wait_for(timeout=SLOW)  # the heading can arrive before the columns under it
    settle(page)
    assert picks.count() == 3
    # every table is as tall as its rows: no empty row below the last (a grid row is 35 px)
    tables = page.locator("[data-testid='stDataFrame']")
    tables.first.wait_for(timeout=SLOW)
    # a table's grid (which carries its row count) draws a moment after its frame
    page.wait_for_function("[...document.querySelectorAll(\"[data-testid='stDataFrame']\")]"
                           ".every(f => f.querySelector('[aria-rowcount]'))", timeout=SLOW)
    heights = tables.evaluate_all("frames => frames.map(f => [f.getBoundingClientRect().height, "
                                  "Number(f.querySelector('[aria-rowcount]').getAttribute('aria-rowcount'))])")
    assert all(height <= 35 * rows + 4 for height, rows in heights), heights
    shoot(page, "teaching_sampler_lab")
    page.get_by_role("button", name="Draw 1,000 times").click()
    page.get_by_text(re.compile("different tokens came up")).wait_for(timeout=SLOW)
    settle(page)
    page.get_by_role("heading", name=re.compile("1,000 draws")).scroll_into_view_if_needed()
    shoot(page, "teaching_sampler_lab_draws", height=1100)


def test_lesson_walks_the_stages_and_scores_a_prediction(page):
    open_page(page, "Lesson")
    page.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
    settle(page)
    shoot(page, "teaching_lesson_tokens", height=1300)
    click_to_heading(page, "Next ▶", "Forward pass → logits")
    shoot(page, "teaching_lesson_logits", height=1300)
    for heading in ("Inside the pass → each layer's guess", "Softmax → probabilities", "Sampling → one token",
                    "Append → context and KV cache", "Check → stop or go round again"):
        click_to_heading(page, "Next ▶", heading)
    shoot(page, "teaching_lesson_check", height=1100)
    click_to_heading(page, "◀ Previous", "Append → context and KV cache")
    shoot(page, "teaching_lesson_kv", height=1100)
    # the prediction exercise, in the same session
    page.get_by_text("Predict the next token").click()
    page.get_by_text("Your prediction for the next token").wait_for(timeout=SLOW)
    settle(page)
    choices = page.get_by_role("radiogroup", name="Your prediction for the next token")
    choices.locator("label").first.click()
    settle(page)
    page.get_by_role("button", name="Reveal the model's distribution").click()
    page.get_by_text("rounds", exact=True).wait_for(timeout=SLOW)
    settle(page)
    shoot(page, "teaching_lesson_predict", height=1400)


def test_kv_speed_measures_and_shows_every_section(page):
    open_page(page, "KV cache & speed")
    page.get_by_role("heading", name=re.compile("Batching")).wait_for(timeout=SLOW)
    page.get_by_text(re.compile(r"ms per token.* at batch 1")).wait_for(timeout=SLOW)
    settle(page)
    assert page.get_by_text(re.compile("46,080 bytes per position")).count() == 1
    assert page.get_by_role("heading", name="How close to memory speed is the step?").count() == 1
    assert page.get_by_text(re.compile("This server's lone decode steps take")).count() == 1
    shoot(page, "teaching_kv_speed", height=6000)
