"""The first visitor after a server start who arrives on a page's own link still gets the
app's frame: the model sidebar and the titled navigation, not Streamlit's automatic menu."""

from __future__ import annotations

import re

import pytest

from bench.appserver import served_app
from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser


def test_a_fresh_servers_first_visit_to_a_page_link_gets_the_frame(browser):
    with served_app(ARTIFACTS / "streamlit_deep_link.log") as url:  # a server no one has visited yet
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        try:
            page.goto(f"{url}/lesson")
            page.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=240_000)
            # the frame: app.py's titled navigation and its model sidebar (a first load may be cold)
            nav = page.locator("[data-testid='stSidebarNav']")
            sidebar = page.locator("[data-testid='stSidebar']")
            try:
                nav.get_by_text("KV cache & speed").wait_for(timeout=60_000)
                sidebar.get_by_text("Load another model").wait_for(timeout=60_000)
            finally:
                page.screenshot(path=str(ARTIFACTS / "deep_link_lesson.png"))
            assert not nav.get_by_text(re.compile(r"^(app|kv speed)$")).count()  # file names: the automatic menu
            assert page.url.endswith("/lesson")
            assert page.get_by_role("heading", name="Prompt → tokens").is_visible()
        finally:
            context.close()
