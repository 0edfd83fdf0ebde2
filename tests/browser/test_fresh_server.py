"""What needs a server of its own, shared by this module's two tests in their order: the first
visitor after a server start who arrives on a page's own link still gets the app's frame (the
model sidebar and the titled navigation, not Streamlit's automatic menu); and a tab left open past
the server's idle time (3 seconds here) has its generation put away, and the visitor's next click
brings it back exactly."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from bench.appserver import served_app_process
from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
CHIPS = "Array.from(document.querySelectorAll('.tbt-chips .tbt-chip:not(.tbt-prompt)')).map(c => c.innerText)"
FIRST_LOAD = 240_000  # ms: a fresh server loads the model on its first visit, longer on a slow machine


@pytest.fixture(scope="module")
def fresh_url() -> Iterator[str]:
    """A server no one has visited when the module starts, whose idle time is 3 seconds."""
    with served_app_process(ARTIFACTS / "streamlit_fresh.log", env={"TBT_IDLE_MINUTES": "0.05"}) as (url, _pid):
        yield url


@pytest.fixture()
def tab(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    yield context.new_page()
    context.close()


def test_a_fresh_servers_first_visit_to_a_page_link_gets_the_frame(tab, fresh_url) -> None:
    tab.goto(f"{fresh_url}/lesson")  # the server's first visit: this test runs first in the module
    tab.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=FIRST_LOAD)
    # the frame: app.py's titled navigation and its model sidebar (a first load may be cold)
    nav = tab.locator("[data-testid='stSidebarNav']")
    sidebar = tab.locator("[data-testid='stSidebar']")
    try:
        nav.get_by_text("KV cache & speed").wait_for(timeout=60_000)
        sidebar.get_by_text("Load another model").wait_for(timeout=60_000)
    finally:
        tab.screenshot(path=str(ARTIFACTS / "deep_link_lesson.png"))
    assert not nav.get_by_text(re.compile(r"^(app|kv speed)$")).count()  # file names: the automatic menu
    assert tab.url.endswith("/lesson")
    assert tab.get_by_role("heading", name="Prompt → tokens").is_visible()


def test_a_visitor_back_from_an_idle_tab_sees_their_tokens_and_steps_on(tab, fresh_url) -> None:
    tab.goto(fresh_url)
    tab.wait_for_function(f"{STEPS} === 0", timeout=FIRST_LOAD)
    step = tab.get_by_role("button", name="Step", exact=True)
    for count in (1, 2, 3):
        step.click()
        tab.wait_for_function(f"{STEPS} === {count}", timeout=120_000)
    before = tab.evaluate(CHIPS)
    tab.wait_for_timeout(6_000)  # idle past 3 s: the server puts the generation away
    step.click()
    tab.get_by_text("Welcome back.").wait_for(timeout=60_000)
    tab.wait_for_function(f"{STEPS} === 4", timeout=60_000)
    assert tab.evaluate(CHIPS)[:3] == before  # rebuilt exactly, then one more step
    tab.mouse.move(5, 790)
    tab.screenshot(path=str(ARTIFACTS / "idle_tab_welcome_back.png"))
