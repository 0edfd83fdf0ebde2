"""One class, two app processes: the rooms in a real PostgreSQL server (TBT_ROOMS_URL), the
presenter on one process and a student on the other, in Chromium. The student's screen follows
each Step made on the other process, their guess reaches the presenter, and when the student's
process is killed and started again on the same address their page recovers by itself with the
room, the steps and their score. Then the presenter's process dies too, and the presenter's page
comes back as the presenter's by itself (its browser is trusted in the database, not in memory)."""

from __future__ import annotations

import os
import re
import signal

import pytest

from bench.appserver import free_port, served_app_process
from bench.postgres import fresh_database
from tests.browser.class_student import guess_field
from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW, settle
from tests.browser.test_class_browser import SHOWN, start_class

pytestmark = pytest.mark.browser
# true once the page has shown no status (connecting, running) for 3 s in a row
QUIET_FOR_3_S = """() => {
    const now = Date.now();
    if (document.querySelector('[data-testid="stStatusWidget"]') || window.tbtBusyAt === undefined) {
        window.tbtBusyAt = now;
    }
    return now - window.tbtBusyAt > 3000;
}"""


@pytest.fixture()
def rooms_url(postgres_url) -> str:
    """A fresh database of the session's PostgreSQL server."""
    return fresh_database(postgres_url)


def test_a_class_on_two_processes_follows_guesses_and_survives_a_restart(browser, rooms_url) -> None:
    env = {"TBT_ROOMS_URL": rooms_url}
    presenter_port, student_port = free_port(), free_port()
    with served_app_process(ARTIFACTS / "class_a_streamlit.log", env=env, port=presenter_port) as (
            presenter_url, presenter_pid):
        presenter = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        code = start_class(presenter, presenter_url)
        settle(presenter)
        with served_app_process(ARTIFACTS / "class_b_streamlit.log", env=env, port=student_port) as (student_url, _):
            student = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
            student.goto(f"{student_url}/class?room={code}")
            student.wait_for_function(f"{SHOWN} === 0", timeout=SLOW)
            for count in (1, 2):
                settle(presenter)
                presenter.get_by_role("button", name="Step").click()
                student.wait_for_function(f"{SHOWN} === {count}", timeout=30_000)  # made on the other process
            field = guess_field(student, 2)
            field.fill("the")
            field.press("Enter")
            student.get_by_text(re.compile("Your guess:")).wait_for(timeout=30_000)
            presenter.get_by_text(re.compile(r"1 guess for the next token")).wait_for(timeout=30_000)
        # the student's process is gone; it comes back on the same address
        with served_app_process(ARTIFACTS / "class_b2_streamlit.log", env=env, port=student_port):
            student.wait_for_function(f"{SHOWN} === 2", timeout=SLOW)  # the page reconnected by itself
            settle(presenter)
            presenter.get_by_role("button", name="Step").click()
            student.wait_for_function(f"{SHOWN} === 3", timeout=60_000)
            student.get_by_text(re.compile(r"Your score:")).wait_for(timeout=30_000)  # the guess was kept
            student.screenshot(path=str(ARTIFACTS / "class_two_servers_student.png"), full_page=True)
            os.kill(presenter_pid, signal.SIGKILL)  # the presenter's process dies with the lesson under way
            # the page says it is connecting (until then it still shows the old Step button)
            presenter.wait_for_function("!!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=30_000)
            with served_app_process(ARTIFACTS / "class_a2_streamlit.log", env=env, port=presenter_port):
                # reconnected by itself and its first run over (it loads the model and replays the room:
                # a click before that goes to a button the new session has not drawn yet)
                presenter.wait_for_function(QUIET_FOR_3_S, timeout=SLOW)
                step = presenter.get_by_role("button", name="Step")
                step.wait_for(timeout=SLOW)  # as the presenter's
                step.click()
                student.wait_for_function(f"{SHOWN} === 4", timeout=60_000)
                # the student sees the step once it is published, which can be before the presenter's
                # own run is over: clicked during that run, the popover once showed nothing in 30 s
                settle(presenter)
                presenter.get_by_text(re.compile("Invite the class")).click()
                popover = presenter.get_by_role("button", name=re.compile("Presenter link"))
                popover.wait_for(timeout=30_000)
                settle(presenter)
                popover.click()
                presenter.get_by_text(re.compile("cannot show the presenter link again")).wait_for(timeout=30_000)
                presenter.screenshot(path=str(ARTIFACTS / "class_presenter_after_restart.png"))
