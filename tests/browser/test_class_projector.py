"""A lesson as a class sees it: the presenter in presentation mode at a projector's 1280x720 and
three students (a laptop, a phone, a phone in dark mode). After a reveal every student's screen
shows the board and their own score and no other student's name; axe finds no serious violation on
any of the four screens. Screenshots go to test-artifacts/class_projector/ for a person to judge."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe

from tests.browser.class_student import guess_field
from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW, settle
from tests.browser.test_class_browser import PHONE, SHOWN, start_class

pytestmark = pytest.mark.browser
SHOTS = ARTIFACTS / "class_projector"
STUDENTS = {"Ada Lovelace": {"viewport": {"width": 1280, "height": 800}},
            "Boris Vian": {"viewport": PHONE, "is_mobile": True, "has_touch": True},
            "Cyra Moss": {"viewport": PHONE, "is_mobile": True, "has_touch": True, "color_scheme": "dark"}}


def serious(page) -> list[str]:
    violations = Axe().run(page).response["violations"]
    return [f"{v['id']} ({v['impact']}): {v['nodes'][0]['html'][:160]}" for v in violations
            if v["impact"] in {"serious", "critical"}]


def test_a_projected_lesson_with_three_students(browser, app_url) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    presenter = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
    code = start_class(presenter, app_url)
    settle(presenter)
    students = {}
    for name, options in STUDENTS.items():
        page = browser.new_context(**options).new_page()
        page.goto(f"{app_url}/class?room={code}")
        page.wait_for_function(f"{SHOWN} === 0", timeout=SLOW)
        page.get_by_label(re.compile("Your name")).fill(name)
        page.get_by_label(re.compile("Your name")).press("Enter")
        settle(page)
        students[name] = page
    for page in students.values():
        field = guess_field(page, 0)
        field.fill("the")
        field.press("Enter")
        page.get_by_text(re.compile("Your guess:")).wait_for(timeout=30_000)
    presenter.get_by_text(re.compile(r"3 guesses for the next token")).wait_for(timeout=30_000)
    presenter.get_by_test_id("stSidebar").get_by_text("Presentation mode").click()
    presenter.get_by_role("button", name=re.compile("Exit presentation")).wait_for(timeout=SLOW)
    settle(presenter)
    presenter.keyboard.press("PageDown")  # the presenter remote's Step
    for name, page in students.items():
        page.wait_for_function(f"{SHOWN} === 1", timeout=30_000)
        page.get_by_text(re.compile("Your score:")).wait_for(timeout=30_000)
        settle(page)
        shown = page.locator("[data-testid='stMain']").inner_text()
        assert not [other for other in STUDENTS if other != name and other in shown], name
        assert "the class named it" in shown
        page.screenshot(path=str(SHOTS / f"student_{name.split()[0]}.png"), full_page=True)
        assert not serious(page), name
    presenter.get_by_text(re.compile("revealed: the model wrote")).first.wait_for(timeout=30_000)  # a busy machine
    settle(presenter)
    presenter.screenshot(path=str(SHOTS / "presenter_1280x720.png"))
    projected = presenter.locator("[data-testid='stMain']").inner_text()
    assert not [name for name in STUDENTS if name in projected]  # no name on the projector
    assert "revealed: the model wrote" in projected
    assert not serious(presenter)
    presenter.get_by_text("End of the lesson: summary and download").click()
    with presenter.expect_download(timeout=30_000) as made:  # the file is made at the click
        presenter.get_by_role("button", name="Download the lesson (CSV)").click()
    table = Path(made.value.path()).read_text(encoding="utf-8")
    assert table.startswith("step,token,model_probability,student,name,guess")
    assert all(name in table for name in STUDENTS) and table.count("student ") == 3  # the teacher's alone
