"""Inside the pass on the Step page, in a real browser, in light and then dark: one click from the
distribution opens the latest step's pass (the lens table, the attention heatmap with its head
selector, the time per layer), and the next Step is opened up in its place. Screenshots go to
test-artifacts/ for a person to look at."""

from __future__ import annotations

import pytest

from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import settle
from tests.browser.test_accessibility import unreadable_chart_text

pytestmark = pytest.mark.browser
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
SLOW = 120_000


def test_the_inside_view_opens_the_latest_pass_and_follows_the_next_step(browser, app_url) -> None:
    """Opened in light; the system then turns dark, and the next Step draws its pass in the dark
    theme."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    page = context.new_page()
    try:
        page.goto(app_url)
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        page.get_by_role("button", name="Step", exact=True).click()
        page.wait_for_function(f"{STEPS} === 1", timeout=SLOW)
        page.get_by_role("radio", name="Inside the pass", exact=True).click()
        page.get_by_text("went through 30 layers").wait_for(timeout=SLOW)
        grid = page.locator("[data-testid='stDataFrame']").first
        grid.wait_for(timeout=SLOW)
        assert page.get_by_text("Step 1: the fed token at position 4").is_visible()
        charts = page.locator(".stPlotlyChart")
        charts.nth(1).wait_for(timeout=SLOW)  # the heatmap and the time per layer
        assert charts.locator(".heatmaplayer").count() == 1
        shoot(page, "light")
        page.emulate_media(color_scheme="dark")
        page.get_by_role("button", name="Step", exact=True).click()
        page.wait_for_function(f"{STEPS} === 2", timeout=SLOW)
        page.get_by_text("Step 2: the fed token at position 5").wait_for(timeout=SLOW)
        settle(page)
        assert charts.locator(".heatmaplayer").count() == 1
        assert not unreadable_chart_text(page)  # the charts drawn again in the dark theme's colours
        shoot(page, "dark")
    finally:
        context.close()


def shoot(page, scheme: str) -> None:
    page.get_by_text("Attention of").scroll_into_view_if_needed()
    page.mouse.move(5, 5)
    page.wait_for_timeout(800)
    page.screenshot(path=str(ARTIFACTS / f"inside_step_{scheme}.png"))
