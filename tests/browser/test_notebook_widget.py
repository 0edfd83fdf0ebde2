"""The Stepper in a real JupyterLab, driven in headless Chromium: a notebook cell makes it on the
real model, and its buttons, a slider and the keys step the generation the Python side keeps, in
JupyterLab's light and dark themes; axe finds nothing serious in the widget."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from bench.appserver import free_port
from tests.browser.axe_audit import serious_violations
from tests.browser.conftest import ARTIFACTS
from ui.views.theme import PAGE_COLOURS

pytestmark = [pytest.mark.browser, pytest.mark.model]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tbt-test"  # the local server's login token: it listens on 127.0.0.1 for this test only
SLOW = 120_000
CELLS = [
    f"import sys\nsys.path.insert(0, {str(ROOT)!r})",
    "from engine import load_model\nfrom ui.notebook import Stepper\n"
    'stepper = Stepper(load_model(), "The capital of France is")\nstepper',
]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory) -> Iterator[str]:
    """A real JupyterLab server over a folder holding one notebook, on a free local port."""
    folder = tmp_path_factory.mktemp("lab")
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, folder / "stepper.ipynb")
    settings = tmp_path_factory.mktemp("lab-settings")
    port = free_port()
    log = open(ARTIFACTS / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", "--allow-root", "--LabApp.extension_manager=readonly",
         f"--ServerApp.root_dir={folder}", f"--LabApp.user_settings_dir={settings}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"OMP_WAIT_POLICY": "PASSIVE"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/api/status?token={TOKEN}", process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def wait_for(url: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyterlab exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"jupyterlab did not answer at {url}")


def set_theme(url: str, theme: str) -> None:
    """JupyterLab's theme setting, through its own settings API."""
    body = json.dumps({"raw": json.dumps({"theme": theme})}).encode()
    request = urllib.request.Request(f"{url}/lab/api/settings/@jupyterlab/apputils-extension:themes?token={TOKEN}",
                                     data=body, method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


def test_the_stepper_steps_the_real_model_from_its_buttons_slider_and_keys_in_either_theme(browser, jupyterlab) -> None:
    """Driven in JupyterLab's light theme; then JupyterLab's menu turns it dark and the widget
    follows at once (its colours come from the notebook's theme)."""
    set_theme(jupyterlab, "JupyterLab Light")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        drive(page, jupyterlab)
        check_theme(page, "light")
        page.get_by_role("menuitem", name="Settings").click()  # JupyterLab's menu: Settings › Theme
        page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Theme$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile("^JupyterLab Dark$")).click()
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=SLOW)
        page.wait_for_function("!document.getElementById('jupyterlab-splash')", timeout=SLOW)  # its fade, over
        check_theme(page, "dark")
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "notebook_stepper_failed.png"))  # what the page showed
        raise
    finally:
        context.close()


def drive(page, jupyterlab: str) -> None:
    """Open the notebook, run it, and use the Stepper as a student would."""
    page.goto(f"{jupyterlab}/lab/tree/stepper.ipynb?token={TOKEN}")
    page.locator(".jp-Notebook").wait_for(timeout=SLOW)
    page.wait_for_function("document.body.dataset.jpThemeLight !== undefined", timeout=SLOW)
    assert page.evaluate("document.body.dataset.jpThemeLight") == "true"
    # Run all before the kernel is connected runs nothing (seen once on a busy machine): wait for it
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=SLOW)
    page.locator(".jp-Notebook").click()
    page.keyboard.press("Escape")
    page.get_by_role("menuitem", name="Run").click()
    page.locator("[data-command='runmenu:run-all']").click()
    stepper = page.locator(".tbt-stepper")
    stepper.locator("button[data-do=step]").wait_for(timeout=SLOW)
    stepper.locator("button[data-do=step]").click()
    stepper.locator(".tbt-chips[data-steps='1']").wait_for(timeout=SLOW)
    # the real model's greedy pick and its raw probability
    assert stepper.locator(".tbt-chips .tbt-newest").inner_text().strip() == "␣Paris"
    assert "77.3%" in stepper.locator(".tbt-bars").first.inner_text()
    stepper.locator(".tbt-view").click()  # a click on the widget gives it the keys
    page.keyboard.press("PageDown")
    stepper.locator(".tbt-chips[data-steps='2']").wait_for(timeout=SLOW)
    stepper.locator("button[data-do=back]").click()
    stepper.locator(".tbt-chips[data-steps='1']").wait_for(timeout=SLOW)
    temperature = stepper.get_by_label("temperature (0 = greedy)")
    temperature.fill("0.8")
    temperature.dispatch_event("change")
    stepper.get_by_text("New settings: they apply from the next Step.").wait_for(timeout=SLOW)
    stepper.locator("button[data-do=step]").click()
    stepper.locator(".tbt-chips[data-steps='2']").wait_for(timeout=SLOW)
    assert "temperature 0.8" in stepper.locator(".tbt-view").inner_text()


def check_theme(page, name: str) -> None:
    """The widget's colours are the notebook theme's (the browser's own scheme stays light), and axe
    finds nothing serious in it."""
    stepper = page.locator(".tbt-stepper")
    stepper.locator(".tbt-view").wait_for(timeout=SLOW)
    muted = stepper.locator(".tbt-nb").first.evaluate("e => getComputedStyle(e).getPropertyValue('--tbt-muted')")
    assert muted.strip() == PAGE_COLOURS[name]["muted"]
    stepper.screenshot(path=str(ARTIFACTS / f"notebook_stepper_{name}.png"))
    assert serious_violations(page, context=".tbt-stepper") == []
