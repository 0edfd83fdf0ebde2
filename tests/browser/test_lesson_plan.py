"""The teacher's lesson plan, start to end, in one browser session per person: a class with a
presenter at the projector (1280x720, presentation mode, driven by the remote's keys) and three
students (a laptop, a phone at 390x844, a laptop in dark mode) who give their names and guess
three tokens, typed or picked from the candidate chips; the projector never shows the model's
answer, a guess or a name before the reveal (only while the presenter peeks), and every screen
shows the reveal after it, no student's screen another student's name, and axe finds nothing
serious on any of the four; the presenter visits another page, comes back to the room and
downloads the lesson's file (every named student's guesses). Then, as a student at home: Step
through with a French prompt and an emoji, Inside the pass, a share link opened in another tab,
the Sampler lab and the Lesson by keyboard only. No page shows an exception at any point. (A very
long prompt: tests/browser/test_step_through_browser.py.)"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from engine import VISIBLE
from tests.browser.axe_audit import serious_violations
from tests.browser.class_student import guess_field
from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW, settle
from tests.browser.test_class_browser import start_class
from tests.browser.test_presentation import presentation_on
from ui.domain.lesson import STAGES

pytestmark = pytest.mark.browser
PROJECTOR = {"width": 1280, "height": 720}
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SHOWN = "Number(document.querySelector('.tbt-class-status')?.dataset.steps ?? -1)"
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
NAMES = ("Ana", "Ben", "Chloé 😀")
TYPED = {0: ("London", "Lyon", "Rome"), 2: ("banana", "violin", "tulip")}  # student → a guess a round
UNDRAWN = {glyph: ch for ch, glyph in VISIBLE.items()}  # a drawn token's text back to its characters
PILLS = "[data-testid='stButtonGroup'] button"


def give_name(student, name: str, tries: int = 3) -> None:
    """Type the name and press Enter until the page confirms it: the field is drawn again by the
    page's own runs, and a press that lands while it is being drawn again is lost (as a
    student's would be; they would press again)."""
    confirmed = student.get_by_text(f"The presenter sees you as {name}.")
    field = student.get_by_label("Your name (optional, shown to the presenter)")
    for _ in range(tries):
        settle(student)
        if confirmed.count():
            return
        if not field.is_visible():  # named once already: the panel folded
            student.get_by_text("Your name and the room").click()
        field.fill(name)
        field.press("Enter")
        try:
            confirmed.wait_for(state="attached", timeout=30_000)
            return
        except PlaywrightTimeout:  # press again
            continue
    raise AssertionError(f"{name!r} was never confirmed: {student.locator('body').inner_text()[-600:]}")


def assert_no_exception(*pages) -> None:
    for page in pages:
        assert page.get_by_test_id("stException").count() == 0, page.url
        assert "Traceback" not in page.locator("body").inner_text(), page.url


def token_text(drawn: str) -> str:
    """A token as the app draws it in quotes ('␣Paris') back to its text (' Paris')."""
    drawn = drawn.strip()
    inner = drawn[1:-1] if len(drawn) >= 2 and drawn[0] == drawn[-1] == "'" else drawn
    return "".join(UNDRAWN.get(ch, ch) for ch in inner)


def class_panel(presenter):
    """The presenter's panel of the class's guesses for the next token (a bordered container)."""
    heading = presenter.get_by_role("heading", name=re.compile("guesses? for the next token"))
    return heading.locator("xpath=ancestor::div[@data-testid='stVerticalBlock'][1]")


def test_the_teachers_lesson_plan_runs_start_to_end(browser, app_url) -> None:
    contexts = []

    def person(**options):
        contexts.append(browser.new_context(**options))
        return contexts[-1].new_page()

    try:
        # ---- the class: a presenter at the projector, three students ---------------------------
        presenter = person(viewport=PROJECTOR)
        code = start_class(presenter, app_url)
        settle(presenter)
        presentation_on(presenter)
        assert "key=" not in presenter.url
        students = [person(viewport=LAPTOP),
                    person(viewport=PHONE, is_mobile=True, has_touch=True),
                    person(viewport=LAPTOP, color_scheme="dark")]
        phone = students[1]
        for student, name in zip(students, NAMES, strict=True):
            student.goto(f"{app_url}/class?room={code}")
            student.wait_for_function(f"{SHOWN} === 0", timeout=SLOW)
            assert not student.get_by_role("button", name="Step").count()  # no control that changes the room
            give_name(student, name)
        presenter.get_by_text(re.compile(r"The class · 3 connected")).wait_for(timeout=SLOW)
        assert_no_exception(presenter, *students)

        for number in (1, 2, 3):
            # the guesses: the laptops type one, the phone taps a candidate chip
            pills = phone.locator(PILLS)
            pills.first.wait_for(timeout=SLOW)  # the candidates come once the room has peeked
            drawn = [token_text(text).strip().lower() for text in pills.all_inner_texts()]
            assert drawn == sorted(drawn), f"the candidates' order gives the answer away: {drawn}"
            pills.first.tap()
            for index, guesses in TYPED.items():
                field = guess_field(students[index], number - 1, timeout=SLOW)
                field.fill(guesses[number - 1])
                field.press("Enter")
            for student in students:
                student.get_by_text(re.compile("Your guess:")).wait_for(timeout=SLOW)
            presenter.get_by_text(re.compile(r"3 guesses for the next token")).wait_for(timeout=SLOW)

            # the projector before the reveal: the count of guesses, nothing of what or whose, nor the answer
            panel = class_panel(presenter)
            shown = panel.inner_text()
            assert "3 guesses for the next token" in shown
            assert not [name for name in NAMES if name in shown], f"a name on the projector before the reveal: {shown}"
            assert not [g for g in (TYPED[0][number - 1], TYPED[2][number - 1]) if g in shown], shown
            assert "hidden from the class" not in shown, "the model's answer on the projector before the reveal"
            assert panel.locator(".tbt-bars").count() == 0, "a distribution in the class panel before the reveal"
            if number == 1:  # nothing revealed yet: no name anywhere on the projector, in view or not
                page_text = presenter.locator("body").inner_text()
                assert not [name for name in NAMES if name in page_text], page_text
                assert not [name for name in NAMES if name in presenter.content()]
                # a student's screen shows no other student's guess either
                assert not [name for name in NAMES[1:] if name in students[0].locator("body").inner_text()]

                # the presenter's Peek shows what was hidden (so the checks above are not vacuous), then hides it
                toggle = presenter.get_by_text("Peek at the guesses and the model's answer")
                toggle.click()
                answer_title = presenter.get_by_text(re.compile("hidden from the class"))
                answer_title.wait_for(timeout=SLOW)
                peeked = class_panel(presenter).inner_text()
                assert all(name in peeked for name in NAMES), peeked
                assert class_panel(presenter).locator(".tbt-bars").count() >= 1
                toggle.click()
                answer_title.wait_for(state="detached", timeout=SLOW)
                presenter.get_by_text(re.compile("stay hidden until the reveal")).wait_for(timeout=SLOW)
                settle(presenter)
                before = presenter.content()
            presenter.evaluate("document.activeElement?.blur()")
            presenter.keyboard.press("PageDown")  # the remote: Step, which reveals the next token

            # the reveal, on the projector and on every student's screen
            revealed = presenter.locator(".tbt-class-reveal", has_text=f"Step {number} revealed")
            revealed.wait_for(timeout=SLOW)
            title = revealed.locator(".tbt-title").first.inner_text()
            wrote = re.search(r"the model wrote '.*?' \(raw", title, re.S).group(0)  # the answer, as drawn
            answer = token_text(wrote.removeprefix("the model wrote ").removesuffix(" (raw"))
            assert re.search(r"\d of 3\s+guesses named it", revealed.inner_text()), revealed.inner_text()
            for student in students:
                student.wait_for_function(f"{SHOWN} === {number}", timeout=SLOW)
                reveal = student.locator(".tbt-class-reveal", has_text=f"Step {number} revealed")
                reveal.wait_for(timeout=SLOW)
                assert wrote in reveal.inner_text(), (reveal.inner_text(), wrote)  # the same answer
            settle(presenter)
            text = presenter.locator(".tbt-class-reveal").first.inner_text()
            # the projector is public: counts, never who (the names are the presenter's peek and download)
            assert not [name for name in NAMES if name in text], f"the reveal names who guessed what: {text}"
            # the invite folded away once the first token is out: the reveal starts on the projector's screen
            top = revealed.evaluate("e => e.getBoundingClientRect().top")
            assert top < 720 * 0.6, f"the reveal starts {top:.0f} px down a 720-px projector"
            if number == 1:
                word = answer.strip()
                assert len(word) >= 3 and word not in "The capital of France is", answer  # a word to look for
                assert word not in before, f"the answer {answer!r} was in the projector's page before the reveal"
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"] + 1, f"the phone's page is {width} px wide"
            assert_no_exception(presenter, *students)
        # after the reveals: each student's screen holds the board and no other student's name, and
        # axe finds nothing serious on any of the four screens
        for student, name in zip(students, NAMES, strict=True):
            settle(student)
            shown = student.locator("[data-testid='stMain']").inner_text()
            assert not [other for other in NAMES if other != name and other in shown], name
            assert "the class named it" in shown
            assert not serious_violations(student), name
        assert not serious_violations(presenter)
        presenter.screenshot(path=str(ARTIFACTS / "lesson_plan_projector.png"))
        phone.screenshot(path=str(ARTIFACTS / "lesson_plan_phone.png"), full_page=True)
        students[2].screenshot(path=str(ARTIFACTS / "lesson_plan_dark_student.png"), full_page=True)

        # the presenter leaves for another page through the Pages menu and comes back to the room
        presenter.get_by_role("button", name=re.compile("Pages")).click()
        presenter.get_by_role("link", name="Step through").click()
        presenter.wait_for_function(f"{STEPS} >= 0 && !location.pathname.endsWith('/class')", timeout=SLOW)
        settle(presenter)
        assert_no_exception(presenter)
        presenter.get_by_role("button", name=re.compile("Pages")).click()
        presenter.get_by_role("link", name="Class").click()
        presenter.get_by_text(re.compile(r"The class · \d+ connected")).wait_for(timeout=SLOW)
        settle(presenter)
        assert presenter.evaluate(STEPS) == 3  # the same room, at its three tokens
        assert code in presenter.locator("body").inner_text()
        presenter.locator(".tbt-class-reveal", has_text="Step 3 revealed").wait_for(timeout=SLOW)
        assert_no_exception(presenter, *students)
        # the lesson's file: every named student's guesses, made at the click
        presenter.get_by_text("End of the lesson: summary and download").click()
        with presenter.expect_download(timeout=SLOW) as made:
            presenter.get_by_role("button", name="Download the lesson (CSV)").click()
        table = Path(made.value.path()).read_text(encoding="utf-8")
        assert table.startswith("step,token,model_probability,student,name,guess")
        rows = list(csv.DictReader(io.StringIO(table)))
        assert len(rows) == 3 * 3  # three steps, three guesses a step
        assert {row["name"] for row in rows} == set(NAMES)  # the names: the teacher's file alone holds them
        assert len({row["student"] for row in rows}) == 3

        # ---- at home: Step through, Inside the pass, a share link --------------------------------
        laptop = person(viewport=LAPTOP)
        laptop.goto(app_url)
        laptop.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        prompt = laptop.get_by_label("Prompt", exact=True)
        prompt.fill("Le petit chat 🐱 est")
        prompt.press("Control+Enter")
        settle(laptop)
        for number in (1, 2):
            laptop.get_by_role("button", name="Step", exact=True).click()
            laptop.wait_for_function(f"{STEPS} === {number}", timeout=SLOW)
        assert "chat" in laptop.locator(".tbt-chips").inner_text()  # the French prompt's chips
        laptop.get_by_role("radio", name="Inside the pass", exact=True).click()
        laptop.get_by_text("went through 30 layers").wait_for(timeout=SLOW)
        settle(laptop)
        # off the projector the lens is a table, a row a layer (its cells are the projector's and the Lesson's)
        laptop.wait_for_function("[...document.querySelectorAll(\"[data-testid='stDataFrame'] [aria-rowcount]\")]"
                                 ".some(g => Number(g.getAttribute('aria-rowcount')) >= 30)", timeout=SLOW)
        laptop.screenshot(path=str(ARTIFACTS / "lesson_plan_inside_the_pass.png"))
        laptop.wait_for_function("location.search.includes('tokens=')", timeout=SLOW)
        newest, link = laptop.locator(".tbt-newest[title]").inner_text(), laptop.url
        assert "tokens=" in link and "%F0%9F%90%B1" in link  # the emoji travels in the link
        again = laptop.context.new_page()  # the share link in a new tab
        again.goto(link)
        again.wait_for_function(f"{STEPS} === 2", timeout=SLOW)
        settle(again)
        assert again.locator(".tbt-newest[title]").inner_text() == newest
        assert again.locator(".tbt-chips").inner_text() == laptop.locator(".tbt-chips").inner_text()
        assert_no_exception(laptop, again)
        again.close()

        # ---- the Sampler lab ----------------------------------------------------------------------
        laptop.get_by_test_id("stSidebar").get_by_role("link", name="Sampler lab").click()
        laptop.get_by_role("heading", name=re.compile("Three samplers on the same logits")).wait_for(timeout=SLOW)
        picks = laptop.locator("[data-testid='stMetricLabel']", has_text="picks")
        picks.nth(2).wait_for(timeout=SLOW)
        settle(laptop)
        slider = laptop.get_by_test_id("stSlider").filter(has_text="temperature").first
        before_value = slider.inner_text()
        slider.get_by_role("slider").focus()
        for _ in range(4):  # 0.05 a press
            slider.get_by_role("slider").press("ArrowRight")
        settle(laptop)
        assert slider.inner_text() != before_value, before_value  # the slider moved (its value shows on it)
        assert picks.count() == 3
        assert laptop.get_by_test_id("stDataFrame").count() >= 1  # the kept sets, token by token
        assert_no_exception(laptop)

        # ---- the Lesson by keyboard only ------------------------------------------------------------
        laptop.get_by_test_id("stSidebar").get_by_role("link", name="Lesson").click()
        laptop.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
        settle(laptop)
        presentation_on(laptop)
        total = len(STAGES)
        laptop.get_by_role("heading", name=re.compile(f"^Stage 1 of {total}")).wait_for(timeout=SLOW)
        for number in (2, 3, 4):
            laptop.keyboard.press("PageDown")
            laptop.get_by_role("heading", name=re.compile(f"^Stage {number} of {total}")).wait_for(timeout=SLOW)
            settle(laptop)
        laptop.keyboard.press("PageUp")
        laptop.get_by_role("heading", name=re.compile(f"^Stage 3 of {total}")).wait_for(timeout=SLOW)
        laptop.locator(".tbt-lens-cell").first.wait_for(timeout=SLOW)  # inside the pass: each layer's guess
        settle(laptop)
        assert laptop.locator(".tbt-lens-cell").count() > 2
        laptop.keyboard.press("PageUp")
        laptop.get_by_role("heading", name=re.compile(f"^Stage 2 of {total}")).wait_for(timeout=SLOW)
        settle(laptop)
        laptop.screenshot(path=str(ARTIFACTS / "lesson_plan_lesson_stage2.png"))
        assert_no_exception(laptop)

        assert_no_exception(laptop, presenter, *students)
    finally:
        for context in contexts:
            context.close()
