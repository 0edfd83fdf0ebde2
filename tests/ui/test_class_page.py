"""The Class page in AppTest: a presenter and students as separate sessions of one server.

Every session here runs in this process, so they share the server's one ClassHall, as real
visitors of one server do. Who may change the room is decided on the server: these tests forge
what a student's browser could send and check the room does not move."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.ui.apptest import APP, as_read
from ui.controllers.class_room import GUESS_SLOTS
from ui.server import deployment
from ui.server.class_room import current_hall
from ui.session.keys import CLASS, STEP

PAGE = "pages/class.py"


@pytest.fixture(autouse=True)
def class_db(tmp_path: Path, monkeypatch) -> Path:
    """A fresh rooms database for each test (the hall is cached per database file)."""
    from ui.server.class_room import wrong_codes

    path = tmp_path / "class.sqlite3"
    monkeypatch.setenv("TBT_CLASS_DB", str(path))
    monkeypatch.setenv("TBT_FOLLOW_PORT", "0")  # no follow endpoint in the test process: students' timers alone
    deployment.class_settings.cache_clear()
    wrong_codes.cache_clear()  # every test's visitors start with a clean record
    yield path
    deployment.class_settings.cache_clear()


def session(query: dict[str, str] | None = None) -> AppTest:
    """A visitor opening the Class page (with `query` in the address)."""
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def everything_shown(at: AppTest) -> str:
    """Every text the session's page holds: markdown, HTML, code blocks, captions, alerts, labels."""
    parts = [m.value for m in at.markdown] + [c.value for c in at.code] + [c.value for c in at.caption]
    parts += [e.value for e in at.error] + [w.value for w in at.warning] + [i.value for i in at.info]
    parts += [str(h.proto) for h in at.get("html")] + [str(t.proto) for t in at.text_input]
    parts += [json.loads(c.proto.json).get("view", "") for c in at.get("bidi_component")]  # the follow view
    return "\n".join(parts)


def start_class() -> tuple[AppTest, str, str]:
    presenter = session()
    presenter.button(key=CLASS.start).click().run()
    assert not presenter.exception, [e.value for e in presenter.exception]
    return presenter, presenter.session_state[CLASS.code], presenter.session_state[CLASS.secret]


def step(presenter: AppTest) -> None:
    presenter.button(key=CLASS.presenter + STEP.step).click().run()
    assert not presenter.exception, [e.value for e in presenter.exception]


def generated_count(at: AppTest) -> int:
    shown = everything_shown(at)
    found = re.findall(r"(?:\*\*|<b>)(\d+)(?:\*\*|</b>) tokens? generated", shown)
    assert found, shown[:500]
    return int(found[0])


def test_a_student_with_the_link_follows_the_presenters_steps_and_sees_no_control(class_db) -> None:
    presenter, code, secret = start_class()
    shown = everything_shown(presenter)
    assert code in shown and f"?room={code}" in shown and f"key={secret}" in shown  # both links, on the presenter's
    student = session({"room": code})
    assert generated_count(student) == 0
    assert not [b for b in student.button if b.key and b.key.startswith(CLASS.presenter)]
    assert not [s for s in student.slider]  # nothing that changes the room
    step(presenter)
    step(presenter)
    student.run()
    assert generated_count(student) == 2 == generated_count(presenter)
    late = session({"room": code.lower()})  # a late joiner sees the current state
    assert generated_count(late) == 2


def test_the_presenter_secret_never_reaches_a_students_page_or_state(class_db) -> None:
    presenter, code, secret = start_class()
    step(presenter)
    student = session({"room": code})
    assert secret not in everything_shown(student)
    assert all(secret not in repr(student.session_state[key]) for key in student.session_state)
    assert "key" not in presenter.query_params  # the address bar drops the secret at once
    files = [class_db, Path(f"{class_db}-wal")]
    assert all(secret.encode() not in path.read_bytes() for path in files if path.exists())


def test_a_students_session_is_refused_any_change_to_the_room(class_db) -> None:
    presenter, code, _ = start_class()
    step(presenter)
    student = session({"room": code})
    # forge what a presenter's page would hold: the prompt widget's value and a pressed Step
    student.session_state[CLASS.presenter + STEP.prompt] = "Forged prompt"
    student.session_state[CLASS.role] = "student"
    student.run()
    from ui.controllers import class_room as class_controller
    from ui.controllers.step_through import step as step_action
    from ui.server.class_room import current_hall

    state = student.session_state.to_dict()
    assert not class_controller.as_presenter(state, current_hall(), step_action)
    assert "Only the room's presenter" in class_controller.problem(state, "refused")
    presenter.run()
    assert generated_count(presenter) == 1 and generated_count(student) == 1
    assert current_hall().room(code).generation.prompt != "Forged prompt"


def test_a_wrong_code_or_secret_gets_one_message_that_names_no_room(class_db) -> None:
    _presenter, code, secret = start_class()
    wrong_key = session({"room": code, "key": secret[:-3] + "abc"})
    no_room = session({"room": "ZZZZZZ"})
    messages = {as_read(e.value) for at in (wrong_key, no_room) for e in at.error}
    assert len(messages) == 1 and "No open room has that code" in messages.pop()
    assert wrong_key.session_state.get(CLASS.role) is None
    assert not [b for b in wrong_key.button if b.key and b.key.startswith(CLASS.presenter)]
    typed = session()
    typed.text_input(key=CLASS.join_code).input("not a code")
    typed.button(key=CLASS.join).click().run()
    assert "No open room has that code" in as_read(typed.error[0].value)


def test_a_students_page_draws_a_few_guess_fields_in_turn_each_empty_for_its_step(class_db) -> None:
    # Streamlit keeps a record of each widget key a session draws until the session ends: a new
    # key a step grew every student's memory for the whole lesson
    presenter, code, _ = start_class()
    student = session({"room": code})
    keys = set()
    for typed in (" the", " a", " it", " and", " of", " to", " in"):
        field = next(t for t in student.text_input if t.key and t.key.startswith(CLASS.guess_text))
        assert field.value == "", "a field drawn again for a new step shows nothing typed for an earlier one"
        keys.add(field.key)
        field.input(typed).run()
        assert "Your guess:" in everything_shown(student)
        step(presenter)
        student.run()
    assert len(keys) == GUESS_SLOTS
    kept = student.session_state._state._state._new_widget_state.widget_metadata  # Streamlit's own records
    assert len([wid for wid in kept if CLASS.guess_text in wid]) == GUESS_SLOTS
    assert len([wid for wid in kept if CLASS.guess_pick in wid]) <= GUESS_SLOTS
    assert current_hall().class_tally(current_hall().room(code)).total == 0  # nothing typed counted for the next token


def test_guesses_and_names_reach_the_presenter_as_plain_text(class_db) -> None:
    presenter, code, _ = start_class()
    student = session({"room": code})
    hostile = "**x** <img src=x onerror=alert(1)>"[:40]
    student.text_input(key=CLASS.name).input(hostile).run()
    field = next(t for t in student.text_input if t.key and t.key.startswith(CLASS.guess_text))
    field.input("[link](http://evil) <b>").run()
    assert not student.exception, [e.value for e in student.exception]
    presenter.toggle(key=CLASS.peek_answer).set_value(True).run()
    html = "\n".join(str(h.proto) for h in presenter.get("html"))
    assert "&lt;img src=x" in html and "<img src=x" not in html
    assert "1 guess for the next token" in everything_shown(presenter)


def test_a_corrupt_database_is_reported_clearly_and_the_app_goes_on(class_db) -> None:
    class_db.write_bytes(b"not a database at all" * 200)
    at = session()
    assert not at.exception
    assert "Classes are not available on this server now" in as_read(at.error[0].value)
    at.switch_page("pages/step_through.py").run()
    assert not at.exception


def test_repeated_wrong_codes_from_one_browser_are_slowed_down(class_db) -> None:
    _presenter, code, _ = start_class()
    at = session()
    for _ in range(4):
        at.text_input(key=CLASS.join_code).input("ZZZZZZ")
        at.button(key=CLASS.join).click().run()
    at.text_input(key=CLASS.join_code).input(code)  # even the right code waits now
    at.button(key=CLASS.join).click().run()
    assert "Too many wrong codes from this browser: try again in" in as_read(at.error[0].value)
    assert at.session_state.get(CLASS.role) is None


def test_the_presenter_drives_the_room_in_presentation_mode_with_the_step_pages_controls(class_db) -> None:
    from ui.session.keys import APP

    presenter, code, _ = start_class()
    presenter.session_state[APP.presentation] = True
    presenter.run()
    presenter.text_area(key=CLASS.presenter + STEP.prompt).input("Once upon a time").run()
    step(presenter)
    presenter.button(key=CLASS.presenter + STEP.back).click().run()
    step(presenter)
    assert not presenter.exception, [e.value for e in presenter.exception]
    html = "\n".join(str(h.proto) for h in presenter.get("html"))
    assert "tbt-bars" in html and "tbt-keys" in html  # the projector's bars and the remote's keys
    student = session({"room": code})
    assert generated_count(student) == 1 and "Once upon a time" in everything_shown(student)


def test_the_presenter_leaves_for_another_page_and_comes_back_to_the_same_room(class_db) -> None:
    """Streamlit drops an undrawn widget's value on a page switch; the room's settings must survive it."""
    presenter, code, _ = start_class()
    presenter.text_area(key=CLASS.presenter + STEP.prompt).input("Once upon a time").run()
    step(presenter)
    presenter.switch_page("pages/step_through.py").run()
    presenter.switch_page(PAGE).run()
    assert not presenter.exception, [e.value for e in presenter.exception]
    assert presenter.session_state[CLASS.code] == code
    assert generated_count(presenter) == 1 and "Once upon a time" in everything_shown(presenter)
    step(presenter)
    assert generated_count(session({"room": code})) == 2


def test_the_projected_room_hides_the_answer_and_the_names_until_the_reveal_and_then_shows_the_reveal_first(
        class_db) -> None:
    presenter, code, _ = start_class()
    presenter.text_area(key=CLASS.presenter + STEP.prompt).input("The capital of France is").run()
    student = session({"room": code})
    student.text_input(key=CLASS.name).input("Ada Lovelace").run()
    field = next(t for t in student.text_input if t.key and t.key.startswith(CLASS.guess_text))
    field.input(" Paris").run()
    presenter.run()
    projected = everything_shown(presenter)
    assert "1 guess" in projected and "Ada Lovelace" not in projected and "hidden from the class" not in projected
    assert "Paris" not in projected.split("1 guess", 1)[1]  # nothing of the guess, nor the model's answer
    presenter.toggle(key=CLASS.peek_answer).set_value(True).run()
    peeked = everything_shown(presenter)
    assert "Ada Lovelace" in peeked and "hidden from the class" in peeked
    presenter.toggle(key=CLASS.peek_answer).set_value(False).run()
    step(presenter)
    html = [str(h.proto) for h in presenter.get("html")]
    reveal = next(i for i, h in enumerate(html) if "revealed: the model wrote" in h)
    context = next(i for i, h in enumerate(html) if "France" in h)  # the context's chips
    assert reveal < context, "the reveal comes right under the buttons, before the context"


def test_after_a_reveal_each_student_sees_their_own_score_and_the_board_but_no_ones_name(class_db) -> None:
    presenter, code, _ = start_class()
    presenter.text_area(key=CLASS.presenter + STEP.prompt).input("The capital of France is").run()
    ada, bob = session({"room": code}), session({"room": code})
    ada.text_input(key=CLASS.name).input("Ada Lovelace").run()
    bob.text_input(key=CLASS.name).input("Bob Stone").run()
    for student, guess in ((ada, " Paris"), (bob, " London")):
        field = next(t for t in student.text_input if t.key and t.key.startswith(CLASS.guess_text))
        field.input(guess).run()
    step(presenter)
    for student in (ada, bob):
        student.run()
    hall = current_hall()
    snapshot = hall.room(code).snapshot
    wrote = snapshot.reveal.pick.text
    for student, mine, other in ((ada, " Paris", "Bob Stone"), (bob, " London", "Ada Lovelace")):
        shown = everything_shown(student)
        right = int(wrote == mine)
        assert f"Your score: <b>{right} of 1</b>" in shown and other not in shown
        assert "the class named it" in shown and "about <b>29%</b>" in shown  # the board; people's published figure
    projected = everything_shown(presenter)
    assert "Ada Lovelace" not in projected and "Bob Stone" not in projected and "Your score" not in projected


def test_the_quiz_reaches_the_students_and_their_answers_the_presenter(class_db) -> None:
    presenter, code, _ = start_class()
    student = session({"room": code})
    presenter.button(key=CLASS.quiz_before).click().run()
    student.run()
    radios = [r for r in student.radio if r.key and r.key.startswith(CLASS.quiz_choice + "before_")]
    assert len(radios) == len(current_hall().quiz) >= 5
    radios[0].set_value(current_hall().quiz[0].answer)
    student.button(key=CLASS.quiz_send).click().run()
    assert not student.exception and "Answers sent" in everything_shown(student)
    presenter.run()
    assert "**1** student(s) have answered so far." in everything_shown(presenter)
    presenter.button(key=CLASS.quiz_close).click().run()
    student.run()
    assert not [r for r in student.radio if r.key and r.key.startswith(CLASS.quiz_choice)]
    assert "before, 1 student: 100% right" in everything_shown(presenter)


def test_only_the_presenter_gets_the_lessons_download(class_db) -> None:
    from ui.controllers import class_room as control

    presenter, code, _ = start_class()
    student = session({"room": code})
    step(presenter)
    labels = [d.proto.label for d in presenter.get("download_button")]
    assert labels == ["Download the lesson (CSV)", "Download the lesson (JSON)"]
    assert not student.get("download_button")
    state = {key: student.session_state[key] for key in (CLASS.role, CLASS.code, CLASS.student)}
    assert control.lesson_files(dict(state), current_hall()) is None
    forged = {**state, CLASS.role: "presenter"}  # a student's session claiming the role without the secret
    assert control.lesson_files(forged, current_hall()) is None
    assert control.lesson_files({**forged, CLASS.secret: "guessed"}, current_hall()) is None
