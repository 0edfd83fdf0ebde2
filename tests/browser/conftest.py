"""Start the real app with `streamlit run` and drive it in headless Chromium."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.appserver import CHROMIUM_FLAGS, chromium_path, free_port, served_app_process
from tests.browser.runs import WatchingBrowser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # each test worker serves its own app
APP_LOG = ARTIFACTS / (f"streamlit-{_WORKER}.log" if _WORKER else "streamlit.log")


# Package scope: the server and Chromium hold a gigabyte and more between them; they go once the
# browser tests are done instead of waiting, idle, through the rest of the suite.
@pytest.fixture(scope="package")
def app_url(tmp_path_factory) -> Iterator[str]:
    """The app served by a real `streamlit run`, shared by the browser tests, the Class page's
    included: its rooms in a database of its own (not the user's), its follow endpoint on a free
    port. Its output goes to APP_LOG. Each class is a room of its own, so the class tests share
    the server as teachers on one server do; a test that needs a server's start, end, log or
    settings to itself starts its own."""
    rooms = tmp_path_factory.mktemp("rooms") / "class.sqlite3"
    env = {"TBT_CLASS_DB": str(rooms), "TBT_FOLLOW_PORT": str(free_port())}
    with served_app_process(APP_LOG, env=env) as (url, _pid):
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


@pytest.fixture(autouse=True)
def closes_its_tabs(request) -> Iterator[None]:
    """Every browser context a test opened is closed when it ends, whatever it left open: a tab
    left behind keeps polling its server (or reconnecting to one that is gone) and drawing, on
    the cores the tests after it need."""
    if "browser" not in request.fixturenames:
        yield
        return
    browser = request.getfixturevalue("browser")
    before = set(browser.contexts)
    yield
    for context in [c for c in browser.contexts if c not in before]:
        context.close()


def app_tab(browser, url: str, **options):
    """A fresh browser tab in a context of its own (a visitor of its own, its own Streamlit session;
    `options` for the context, 1280x800 unless they give a viewport) on the app at `url`, once the
    app is drawn. Closing its context closes it."""
    context = browser.new_context(**({"viewport": {"width": 1280, "height": 800}} | options))
    tab = context.new_page()
    tab.goto(url)
    tab.wait_for_selector("[data-testid='stApp']", timeout=60_000)
    return tab


@pytest.fixture()
def page(browser, app_url):
    """A fresh browser tab (its own Streamlit session) on the app, 1280x800."""
    tab = app_tab(browser, app_url)
    yield tab
    tab.context.close()
