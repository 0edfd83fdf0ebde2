"""A crafted share link cannot put a link or an image inside the app: every piece of visitor
text that reaches a message (a bad seed, a model name, a prompt with special tokens) is shown
as plain text, checked in the page Chromium draws."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser

EVIL = "evil.example"
MARKDOWN = f"[Log in again](https://{EVIL}/login) ![x](https://{EVIL}/pixel.png) www.{EVIL} <img src=x>"


@pytest.mark.parametrize(("name", "params", "shown"), [
    ("seed", {"prompt": "Hello", "seed": MARKDOWN}, "Log in again"),
    ("model", {"prompt": "Hello", "model": MARKDOWN}, "Log in again"),
    ("stop", {"prompt": "Hello", "stop": [MARKDOWN * 3]}, "Log in again"),  # too long: its start is quoted
    ("stops", {"prompt": "Hello", "stop": [MARKDOWN[:150]] * 5}, "5 sequences"),  # too many: counted, not quoted
])
def test_a_crafted_link_shows_its_text_without_any_anchor_or_image(browser, app_url, name, params, shown):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        page.goto(f"{app_url}/?{urlencode(params, doseq=True)}")
        warning = page.locator("[data-testid='stAlertContentWarning']").filter(has_text="cannot be opened")
        warning.first.wait_for(timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / f"hostile_link_{name}.png"))
        assert page.locator(f"a[href*='{EVIL}']").count() == 0
        assert page.locator(f"img[src*='{EVIL}'], img[src='x']").count() == 0
        assert shown in warning.first.inner_text()  # the text is there, as text
    finally:
        context.close()
