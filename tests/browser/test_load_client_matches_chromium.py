"""The load benchmark's headless visitor (bench/streamlit_client.py) gets what a real browser
gets: the same share link, clicked through the same number of Steps, in Chromium and in the
client, ends with the same tokens."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from bench.load_bench import STEP_KEY, Link, link_for, open_visitor
from bench.streamlit_client import tokens_in
from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
CLICKS = 6
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
LINK_TOKENS = "(new URLSearchParams(location.search).get('tokens') ?? '').split(',').filter(Boolean).length"


async def client_visit(url: str, link: Link) -> tuple[list[int], list[str]]:
    visitor = await open_visitor(url, link)
    try:
        for _ in range(CLICKS):
            await visitor.click(STEP_KEY)
        return visitor.tokens, visitor.errors
    finally:
        await visitor.close()


def test_the_headless_client_and_chromium_get_the_same_tokens_from_one_link(browser, app_url):
    link = link_for(3, CLICKS)  # a sampled setting with its own seed: a wrong client would drift
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        page.goto(f"{app_url}/?{link.query()}")
        page.wait_for_function(f"{STEPS} === 0", timeout=180_000)
        step = page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Step", exact=True)
        for n in range(1, CLICKS + 1):
            step.click()
            page.wait_for_function(f"{STEPS} === {n} && {LINK_TOKENS} === {n}", timeout=60_000)
        page.mouse.move(5, 790)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "load_client_chromium.png"))
        in_browser = tokens_in(urlparse(page.url).query)
    finally:
        context.close()
    # Playwright's sync API holds this thread's event loop: the client's asyncio runs beside it
    with ThreadPoolExecutor(max_workers=1) as pool:
        in_client, errors = pool.submit(asyncio.run, client_visit(app_url, link)).result(timeout=300)
    assert len(in_browser) == CLICKS
    assert in_client == in_browser
    assert errors == []
