"""Breaking the chain in a real browser: reached from the sidebar, two Steps show a round with
its verified positions, Run goes to the end with both lanes identical; screenshots go to
test-artifacts/ for a person to look at."""

from __future__ import annotations

import re

import pytest

from tests.browser.test_teaching_pages import SLOW, open_page, settle, shoot

pytestmark = pytest.mark.browser


def test_steps_then_run_show_rounds_beside_plain_decoding(page):
    open_page(page, "Breaking the chain")
    page.get_by_role("button", name="Step").wait_for(timeout=SLOW)
    settle(page)
    for _ in range(5):  # the copying preset: the first rounds read the prompt, then guesses start
        page.get_by_role("button", name="Step", exact=True).click()
        settle(page)
    page.get_by_role("heading", name=re.compile(r"Round 5:")).wait_for(timeout=SLOW)
    assert page.locator(".bc-pos").count() >= 1
    shoot(page, "breaking_the_chain_round", height=1800)
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text(re.compile("finished: eos")).wait_for(timeout=SLOW)
    settle(page)
    assert page.get_by_text(re.compile("Identical text, token for token")).is_visible()
    passes = page.locator("[data-testid='stMetricValue']").all_inner_texts()
    tokens, speculative, plain = (int(v) for v in passes[:3])
    assert speculative < plain == tokens
    shoot(page, "breaking_the_chain_finished", height=2600)
