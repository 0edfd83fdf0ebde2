"""Same prompt, different answers in a real browser: a visitor runs the experiment from the form;
at a projector's 1280x720 in presentation mode the findings, the chart and the texts side by side
are on the first screen; at a phone's width nothing runs off the side; axe finds nothing serious
in either theme. Screenshots go to test-artifacts/determinism/ for a person to judge."""

from __future__ import annotations

import re

import pytest

from tests.browser.axe_audit import serious_violations
from tests.browser.conftest import ARTIFACTS, app_tab
from tests.browser.runs import SLOW, settle
from tests.browser.test_presentation import outside_viewport, presentation_on
from tests.browser.test_teaching_pages import open_page

pytestmark = pytest.mark.browser
SHOTS = ARTIFACTS / "determinism"
SMALL = {"Runs in each mode": "3", "New tokens": "12"}  # seconds on two cores, not half a minute
FIRST_SCREEN = {
    "completions": "[data-testid='stMetric']",
    "the step chart": ".js-plotly-plot",
    "the texts side by side": ".tbt-det-texts",
}


def run_experiment(page, fields: dict[str, str] = SMALL) -> None:
    """Fill the form as a visitor does and press Run; wait for the findings."""
    for label, value in fields.items():
        box = page.get_by_label(label, exact=True)
        box.fill(value)
        box.press("Tab")
    page.get_by_role("button", name="Run the experiment").click()
    page.get_by_role("heading", name=re.compile("One run, token by token")).wait_for(timeout=SLOW)
    page.get_by_test_id("stMetric").first.wait_for(timeout=SLOW)  # the findings, drawn above it
    settle(page)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_visitor_runs_it_and_presents_it_on_one_projector_screen(browser, app_url, theme) -> None:
    page = app_tab(browser, app_url, viewport={"width": 1280, "height": 720}, color_scheme=theme)
    try:
        open_page(page, "Same prompt, different answers")
        run_experiment(page)
        metrics = page.get_by_test_id("stMetric").all_inner_texts()
        assert any(re.search(r"exact: completions\s+1 of 3", text) for text in metrics), metrics
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"page_{theme}.png"), full_page=False)
        assert not serious_violations(page, also={"heading-order"})
        presentation_on(page)
        page.get_by_test_id("stMain").evaluate("main => main.scrollTo(0, 0)")
        settle(page)
        page.screenshot(path=str(SHOTS / f"presenting_1280x720_{theme}.png"))
        assert not outside_viewport(page, FIRST_SCREEN, 1280, 720)
        assert not serious_violations(page, also={"heading-order"})
    finally:
        page.context.close()


def test_at_a_phones_width_nothing_runs_off_the_side(browser, app_url) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                                  has_touch=True)
    page = context.new_page()
    try:
        page.goto(f"{app_url.rstrip('/')}/determinism")  # a link a student was sent
        page.get_by_role("heading", name="Same prompt, different answers").wait_for(timeout=SLOW)
        settle(page)
        run_experiment(page)
        wide = page.evaluate("document.querySelector('[data-testid=stMain]').scrollWidth")
        assert wide <= 390, wide
        texts = page.locator(".tbt-det-texts").bounding_box()
        assert texts is not None and texts["x"] >= 0 and texts["x"] + texts["width"] <= 391
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "phone.png"), full_page=True)
        assert not serious_violations(page, also={"heading-order"})
    finally:
        context.close()
