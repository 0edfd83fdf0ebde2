"""Start the real app with `streamlit run` and drive it in headless Chromium."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.appserver import CHROMIUM_FLAGS, chromium_path, served_app
from tests.browser.runs import WatchingBrowser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


# Package scope: the server and Chromium hold a gigabyte and more between them; they go once the
# browser tests are done instead of waiting, idle, through the rest of the suite.
@pytest.fixture(scope="package")
def app_url() -> Iterator[str]:
    """The app served by a real `streamlit run`, shared by the browser tests."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # each test worker serves its own app
    with served_app(ARTIFACTS / (f"streamlit-{worker}.log" if worker else "streamlit.log")) as url:
        yield url


@pytest.fixture(scope="package")
def browser():
    """Headless Chromium through Playwright, each of its tabs watching the app's runs
    (tests/browser/runs.py). Missing Chromium fails in CI, skips elsewhere."""
    executable = chromium_path()
    if executable is None:
        message = "no Chromium found: install Debian's `chromium` (CI installs it) or set CHROMIUM_PATH"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        yield WatchingBrowser(instance)
        instance.close()


@pytest.fixture()
def page(browser, app_url):
    """A fresh browser tab (its own Streamlit session) on the app, 1280x800."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.goto(app_url)
    tab.wait_for_selector("[data-testid='stApp']", timeout=60_000)
    yield tab
    context.close()
