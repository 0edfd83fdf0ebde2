"""The Class page in a real browser: a presenter and a student in two browser contexts (two
visitors), the student's screen following the presenter's Step without a reload. Screenshots of
both views, light and dark, and the student's on a 390x844 phone, go to test-artifacts/; axe finds
nothing serious on the dark phone after a reveal."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser.axe_audit import serious_violations
from tests.browser.class_student import guess_field
from tests.browser.conftest import APP_LOG, ARTIFACTS
from tests.browser.runs import SLOW, settle

pytestmark = pytest.mark.browser
PHONE = {"width": 390, "height": 844}
SHOWN = "Number(document.querySelector('.tbt-class-status')?.dataset.steps ?? -1)"


def start_class(presenter, url: str) -> str:
    """The presenter opens the Class page of the app at `url` and presses Start a class; returns
    the room's join code once the projector shows it."""
    presenter.goto(f"{url}/class")
    presenter.get_by_role("button", name="Start a class").click(timeout=SLOW)
    presenter.locator(".tbt-class-code").wait_for(timeout=SLOW)
    code = presenter.locator(".tbt-class-code").inner_text().strip()
    assert re.fullmatch(r"[A-Z2-9]{6}", code), code
    return code


def test_a_students_screen_follows_the_presenters_step_and_the_guess_reaches_the_presenter(browser, app_url):
    teacher = browser.new_context(viewport={"width": 1280, "height": 900})
    presenter = teacher.new_page()
    code = start_class(presenter, app_url)
    settle(presenter)
    assert "key=" not in presenter.url  # the secret is not in the address bar on the projector
    presenter.get_by_test_id("stImage").first.hover()  # the QR code's full-screen button shows
    toolbar = presenter.get_by_test_id("stElementToolbar").first.bounding_box()
    header = presenter.locator("[data-testid='stExpander'] summary").first.bounding_box()
    assert toolbar["y"] >= header["y"] + header["height"], (toolbar, header)  # not over "Invite the class"
    presenter.screenshot(path=str(ARTIFACTS / "class_presenter_light.png"), full_page=True)

    phone = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    student = phone.new_page()
    student.goto(f"{app_url}/class?room={code}")
    student.wait_for_function(f"{SHOWN} === 0", timeout=SLOW)
    assert not student.get_by_role("button", name="Step").count()  # no control that changes the room
    assert "key=" not in student.content()

    settle(presenter)
    clicked = time.monotonic()
    presenter.get_by_role("button", name="Step").click()
    student.wait_for_function(f"{SHOWN} === 1", timeout=10_000)  # no reload: the page follows
    follow_s = time.monotonic() - clicked
    assert follow_s < 5, follow_s
    field = guess_field(student, 1, timeout=10_000)
    field.fill("Paris")
    field.press("Enter")
    student.get_by_text(re.compile("Your guess:")).wait_for(timeout=10_000)
    presenter.get_by_text(re.compile(r"1 guess for the next token")).wait_for(timeout=10_000)
    settle(student)
    student.screenshot(path=str(ARTIFACTS / "class_student_phone_light.png"), full_page=True)
    width = student.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"] + 1, width  # nothing wider than the phone
    box = student.locator(".tbt-class-reveal").first.bounding_box()
    values = student.locator(".tbt-class-reveal .tbt-bars-value")
    assert any(text.endswith("100.0%") for text in values.all_inner_texts())  # greedy: the pick's final p
    for value in values.all():
        right = value.bounding_box()["x"] + value.bounding_box()["width"]
        assert right <= box["x"] + box["width"], (value.inner_text(), right, box)  # inside the reveal's box

    dark_phone = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True, color_scheme="dark")
    dark_student = dark_phone.new_page()
    dark_student.goto(f"{app_url}/class?room={code}")  # a late joiner sees the current state
    dark_student.wait_for_function(f"{SHOWN} === 1", timeout=SLOW)
    settle(dark_student)
    dark_student.screenshot(path=str(ARTIFACTS / "class_student_phone_dark.png"), full_page=True)
    assert not serious_violations(dark_student)  # a phone in dark mode, after a reveal

    presenter.reload()  # a reload, and a second tab of the same browser, are the presenter again
    presenter.get_by_role("button", name="Step").wait_for(timeout=SLOW)
    second_tab = teacher.new_page()
    second_tab.goto(f"{app_url}/class?room={code}")
    second_tab.get_by_role("button", name="Step").wait_for(timeout=SLOW)
    assert not second_tab.get_by_label(re.compile("type your guess")).count()
    second_tab.close()
    settle(presenter)

    presenter_link = presenter.evaluate(
        "[...document.querySelectorAll('code')].map(c => c.innerText).find(t => t.includes('&key=')) ?? ''")
    if not presenter_link:  # the link sits in a popover, in the invite panel (folded once a token is out)
        popover = presenter.get_by_role("button", name=re.compile("Presenter link"))
        if not popover.is_visible():
            presenter.get_by_text(re.compile("Invite the class")).click()
            popover.wait_for(timeout=30_000)
        settle(presenter)
        popover.click()
        presenter.locator("code", has_text="&key=").first.wait_for(timeout=30_000)
        presenter_link = presenter.locator("code", has_text="&key=").first.inner_text()
    dark = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
    dark_presenter = dark.new_page()
    dark_presenter.goto(presenter_link.strip().replace("\n", ""))
    dark_presenter.get_by_role("button", name="Step").wait_for(timeout=SLOW)  # the link makes a presenter
    settle(dark_presenter)
    dark_presenter.screenshot(path=str(ARTIFACTS / "class_presenter_dark.png"), full_page=True)
    for context in (teacher, phone, dark_phone, dark):
        context.close()
    secret = presenter_link.split("key=", 1)[1].strip()
    assert len(secret) >= 22 and secret not in APP_LOG.read_text()  # nor in a log


def test_each_step_brings_an_empty_guess_field_and_each_guess_counts_for_its_own_step(browser, app_url):
    # the page draws a few fields in turn (ui/controllers/class_room.py guess_keys): past the
    # first round a field comes back for a new step, and must come back empty in the browser too
    presenter = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    code = start_class(presenter, app_url)
    student = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True).new_page()
    student.goto(f"{app_url}/class?room={code}")
    for shown, word in enumerate(("the", "a", "it", "and", "of")):
        student.wait_for_function(f"{SHOWN} === {shown}", timeout=SLOW)
        field = guess_field(student, shown)
        expect(field).to_have_value("")
        field.fill(word)
        field.press("Enter")
        student.get_by_text(re.compile(f"Your guess:.*\\b{word}\\b")).wait_for(timeout=10_000)
        presenter.get_by_text(re.compile(r"\b1 guess for the next token")).wait_for(timeout=10_000)
        settle(presenter)
        presenter.get_by_role("button", name="Step").click()
    student.wait_for_function(f"{SHOWN} === 5", timeout=10_000)
    expect(guess_field(student, 5)).to_have_value("")
    assert not student.get_by_text(re.compile("Your guess:")).count()  # nothing guessed yet for the sixth
    student.get_by_text(re.compile(r"Your score: \d+ of 5")).wait_for(timeout=10_000)
    student.context.close()
    presenter.context.close()
