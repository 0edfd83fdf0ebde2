"""The teacher's lesson plan, start to end, in one browser session per person: a class with a
presenter at the projector (1280x720, presentation mode, driven by the remote's keys) and three
students (a laptop, a phone at 390x844, a laptop in dark mode) who give their names and guess
three tokens; the projector never shows the answer or a name before the reveal; the presenter
visits another page and comes back to the room. Then, as a student at home: Step through with a
French prompt and an emoji, Inside the pass, a share link opened in another tab, the Sampler lab,
the Lesson by keyboard only and a very long prompt. No page shows an exception at any point."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from bench.appserver import served_app_process
from tests.browser.conftest import ARTIFACTS
from tests.browser.test_presentation import presentation_on

pytestmark = pytest.mark.browser
SLOW = 240_000
PHONE = {"width": 390, "height": 844}
SHOWN = "Number(document.querySelector('.tbt-class-status')?.dataset.steps ?? -1)"
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
NAMES = ("Ana", "Ben", "Chloé 😀")
GUESSES = ("Paris", " the", "London")


@pytest.fixture(scope="module")
def plan_url(tmp_path_factory) -> Iterator[str]:
    """A server of its own, with its own rooms database."""
    db = tmp_path_factory.mktemp("plan") / "class.sqlite3"
    with served_app_process(ARTIFACTS / "lesson_plan_streamlit.log", env={"TBT_CLASS_DB": str(db)}) as (url, _pid):
        yield url


def settle(page) -> None:
    page.wait_for_timeout(400)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=SLOW)
    page.wait_for_timeout(300)


def assert_no_exception(*pages) -> None:
    for page in pages:
        assert page.get_by_test_id("stException").count() == 0, page.url
        assert "Traceback" not in page.locator("body").inner_text(), page.url


def test_the_teachers_lesson_plan_runs_start_to_end(browser, plan_url) -> None:
    contexts = []

    def person(**options):
        contexts.append(browser.new_context(**options))
        return contexts[-1].new_page()

    try:
        # ---- the class: a presenter at the projector, three students ---------------------------
        presenter = person(viewport={"width": 1280, "height": 720})
        presenter.goto(f"{plan_url}/class")
        presenter.get_by_role("button", name="Start a class").click(timeout=SLOW)
        presenter.locator(".tbt-class-code").wait_for(timeout=SLOW)
        code = presenter.locator(".tbt-class-code").inner_text().strip()
        settle(presenter)
        presentation_on(presenter)
        students = [person(viewport={"width": 1280, "height": 800}),
                    person(viewport=PHONE, is_mobile=True, has_touch=True),
                    person(viewport={"width": 1280, "height": 800}, color_scheme="dark")]
        for student, name in zip(students, NAMES, strict=True):
            student.goto(f"{plan_url}/class?room={code}")
            student.wait_for_function(f"{SHOWN} === 0", timeout=SLOW)
            field = student.get_by_label("Your name (optional, shown to the presenter)")
            field.fill(name)
            field.press("Enter")
            student.get_by_text(f"The presenter sees you as {name}.").wait_for(state="attached", timeout=SLOW)
        for number in (1, 2, 3):
            for student, guess in zip(students, GUESSES, strict=True):
                field = student.get_by_label(re.compile("type your guess"))
                field.fill(guess)
                field.press("Enter")
                student.get_by_text(re.compile("Your guess:")).wait_for(timeout=SLOW)
            presenter.get_by_text(re.compile(r"3 guesses for the next token")).wait_for(timeout=SLOW)
            # the class's panel for the next token: who guessed what, and the model's answer, stay hidden
            # (the box of the token revealed last names its guesses: that token is out)
            heading = presenter.get_by_role("heading", name=re.compile("guesses for the next token"))
            panel = heading.locator("xpath=ancestor::div[@data-testid='stVerticalBlock'][1]").inner_text()
            assert "3 guesses for the next token" in panel
            assert not [name for name in NAMES if name in panel], f"a name on the projector before the reveal: {panel}"
            assert "hidden from the class" not in panel, "the model's answer on the projector before the reveal"
            presenter.keyboard.press("PageDown")  # the remote: the next token, which reveals this one
            for student in students:
                student.wait_for_function(f"{SHOWN} === {number}", timeout=SLOW)
                student.locator(".tbt-class-reveal").wait_for(timeout=SLOW)
            settle(presenter)
        assert students[1].evaluate("document.documentElement.scrollWidth") <= PHONE["width"] + 1
        presenter.screenshot(path=str(ARTIFACTS / "lesson_plan_projector.png"))
        students[1].screenshot(path=str(ARTIFACTS / "lesson_plan_phone.png"), full_page=True)
        students[2].screenshot(path=str(ARTIFACTS / "lesson_plan_dark_student.png"), full_page=True)
        assert_no_exception(presenter, *students)

        # the presenter leaves for another page through the Pages menu and comes back to the room
        presenter.get_by_role("button", name=re.compile("Pages")).click()
        presenter.get_by_role("link", name="Step through").click()
        presenter.wait_for_function(f"{STEPS} >= 0", timeout=SLOW)
        settle(presenter)
        presenter.get_by_role("button", name=re.compile("Pages")).click()
        presenter.get_by_role("link", name="Class").click()
        presenter.get_by_text(re.compile(r"The class · \d+ connected")).wait_for(timeout=SLOW)
        assert presenter.evaluate(STEPS) == 3  # the same room, at its three tokens
        assert_no_exception(presenter)

        # ---- at home: Step through, Inside the pass, a share link --------------------------------
        laptop = person(viewport={"width": 1280, "height": 800})
        laptop.goto(plan_url)
        laptop.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        prompt = laptop.get_by_label("Prompt", exact=True)
        prompt.fill("Le petit chat 🐱 est")
        prompt.press("Control+Enter")
        settle(laptop)
        for number in (1, 2):
            laptop.get_by_role("button", name="Step", exact=True).click()
            laptop.wait_for_function(f"{STEPS} === {number}", timeout=SLOW)
        laptop.get_by_role("radio", name="Inside the pass", exact=True).click()
        laptop.get_by_text("went through 30 layers").wait_for(timeout=SLOW)
        settle(laptop)
        newest, link = laptop.locator(".tbt-newest[title]").inner_text(), laptop.url
        assert "tokens=" in link and "%F0%9F%90%B1" in link  # the emoji travels in the link
        again = person(viewport={"width": 1280, "height": 800})
        again.goto(link)
        again.wait_for_function(f"{STEPS} === 2", timeout=SLOW)
        assert again.locator(".tbt-newest[title]").inner_text() == newest
        assert_no_exception(laptop, again)

        # ---- the Sampler lab ----------------------------------------------------------------------
        laptop.get_by_role("link", name="Sampler lab").click()
        laptop.get_by_role("heading", name=re.compile("Three samplers on the same logits")).wait_for(timeout=SLOW)
        settle(laptop)
        assert_no_exception(laptop)

        # ---- the Lesson by keyboard only ------------------------------------------------------------
        laptop.get_by_role("link", name="Lesson").click()
        laptop.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
        settle(laptop)
        presentation_on(laptop)
        for number in (2, 3, 4):
            laptop.keyboard.press("PageDown")
            laptop.get_by_role("heading", name=re.compile(f"^Stage {number} of 7")).wait_for(timeout=SLOW)
            settle(laptop)
        laptop.keyboard.press("PageUp")
        laptop.get_by_role("heading", name=re.compile("^Stage 3 of 7")).wait_for(timeout=SLOW)
        assert_no_exception(laptop)

        # ---- a very long prompt -------------------------------------------------------------------
        home = person(viewport={"width": 1280, "height": 800})
        home.goto(plan_url)
        home.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        long_prompt = " ".join(f"Sentence {i} tells of a river, a town and the people who lived there."
                               for i in range(120))
        field = home.get_by_label("Prompt", exact=True)
        field.fill(long_prompt)
        field.press("Control+Enter")
        home.get_by_text(re.compile(r"^This prompt is 2,\d{3} tokens")).wait_for(timeout=SLOW)
        home.get_by_role("button", name="Step", exact=True).click()
        home.wait_for_function(f"{STEPS} === 1", timeout=SLOW)
        settle(home)
        assert_no_exception(home, presenter, *students)
    finally:
        for context in contexts:
            context.close()
