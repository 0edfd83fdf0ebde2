"""A tab left open past the server's idle time: its generation is put away, and the visitor's
next click brings it back exactly (a server of its own, with a 3-second idle time)."""

from __future__ import annotations

import pytest

from bench.appserver import served_app_process
from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
CHIPS = "Array.from(document.querySelectorAll('.tbt-chips .tbt-chip:not(.tbt-prompt)')).map(c => c.innerText)"


def test_a_visitor_back_from_an_idle_tab_sees_their_tokens_and_steps_on(browser) -> None:
    with served_app_process(ARTIFACTS / "streamlit_idle.log", env={"TBT_IDLE_MINUTES": "0.05"}) as (url, _pid):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        try:
            page.goto(url)
            # a fresh server loads the model on this first visit: longer than a click's 30 s on a slow machine
            page.wait_for_function(f"{STEPS} === 0", timeout=240_000)
            step = page.get_by_role("button", name="Step", exact=True)
            for count in (1, 2, 3):
                step.click()
                page.wait_for_function(f"{STEPS} === {count}", timeout=120_000)
            before = page.evaluate(CHIPS)
            page.wait_for_timeout(6_000)  # idle past 3 s: the server puts the generation away
            step.click()
            page.get_by_text("Welcome back.").wait_for(timeout=60_000)
            page.wait_for_function(f"{STEPS} === 4", timeout=60_000)
            assert page.evaluate(CHIPS)[:3] == before  # rebuilt exactly, then one more step
            page.mouse.move(5, 790)
            page.screenshot(path=str(ARTIFACTS / "idle_tab_welcome_back.png"))
        finally:
            context.close()
