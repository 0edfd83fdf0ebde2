"""Start the real app with `streamlit run` and drive it in headless Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """A system Chromium (Debian's is /usr/bin/chromium); CHROMIUM_PATH overrides."""
    for candidate in (os.environ.get("CHROMIUM_PATH"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"streamlit did not answer at {url} within {timeout} s")


@contextmanager
def served_app(log_name: str) -> Iterator[str]:
    """A fresh `streamlit run app.py` on a free local port; its output goes to test-artifacts/."""
    port = _free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / log_name, "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


@pytest.fixture(scope="session")
def app_url() -> Iterator[str]:
    """The app served by a real `streamlit run`, shared by the browser tests."""
    with served_app("streamlit.log") as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium through Playwright. Missing Chromium fails in CI, skips elsewhere."""
    executable = chromium_path()
    if executable is None:
        message = "no Chromium found: install Debian's `chromium` (CI installs it) or set CHROMIUM_PATH"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        yield instance
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
