"""The Class page's controller on plain state (no Streamlit): who a returning browser is."""

from __future__ import annotations

from itertools import pairwise

from classroom import WrongCodeThrottle
from engine import Generation
from tests.classroom.test_hall import make_hall
from ui.controllers import class_room as control
from ui.session import idle_rebuild
from ui.session.keys import CLASS

TEACHER, STUDENT_BROWSER = "cookie:teacher", "cookie:student"


def test_a_reload_or_second_tab_of_the_presenters_browser_reopens_the_room_as_presenter(tiny_lm, tmp_path) -> None:
    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    first: dict = {}
    control.start_class(first, hall, tiny_lm, None, TEACHER)
    code = first[CLASS.code]
    reloaded: dict = {}  # a reload is a new session with the room alone in the address
    control.open_address(reloaded, hall, {"room": code}, TEACHER, throttle)
    assert control.role(reloaded) == control.PRESENTER and control.current_room(reloaded, hall) is not None
    student: dict = {}
    control.open_address(student, hall, {"room": code}, STUDENT_BROWSER, throttle)
    assert control.role(student) == control.STUDENT and CLASS.secret not in student


def test_a_browser_known_only_by_its_address_is_never_made_presenter_by_it(tiny_lm, tmp_path) -> None:
    """A whole class can share one address (one school network): only the browser's own cookie counts."""
    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    first: dict = {}
    control.start_class(first, hall, tiny_lm, None, "address:10.0.0.7")
    again: dict = {}
    control.open_address(again, hall, {"room": first[CLASS.code]}, "address:10.0.0.7", throttle)
    assert control.role(again) == control.STUDENT and CLASS.secret not in again


def test_a_browser_that_opened_the_presenter_link_is_remembered_too(tiny_lm, tmp_path) -> None:
    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    first: dict = {}
    control.start_class(first, hall, tiny_lm, None, TEACHER)
    code, secret = first[CLASS.code], first[CLASS.secret]
    tablet: dict = {}
    control.open_address(tablet, hall, {"room": code, "key": secret}, "cookie:tablet", throttle)
    tablet_again: dict = {}
    control.open_address(tablet_again, hall, {"room": code}, "cookie:tablet", throttle)
    assert control.role(tablet_again) == control.PRESENTER


def test_after_a_restart_the_presenters_browser_drives_the_room_again_without_its_link(tiny_lm, tmp_path) -> None:
    from ui.controllers import step_through as stepper

    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    first: dict = {}
    control.start_class(first, hall, tiny_lm, None, TEACHER)
    code = first[CLASS.code]
    hall.store.close()
    restarted = make_hall(tiny_lm, tmp_path / "rooms.sqlite3")
    back: dict = {}  # the page's reconnect: a new session, the room alone in the address
    control.open_address(back, restarted, {"room": code}, TEACHER, throttle)
    assert control.role(back) == control.PRESENTER and not control.presenter_link_known(back)
    room = control.current_room(back, restarted)
    assert control.as_presenter(back, restarted, stepper.step, room.snapshot.context)
    assert len(room.generation.steps) == 1 and control.lesson_files(back, restarted) is not None
    student: dict = {}
    control.open_address(student, restarted, {"room": code}, STUDENT_BROWSER, throttle)
    assert control.role(student) == control.STUDENT
    forged = {**student, CLASS.role: control.PRESENTER, CLASS.presenter_browser: STUDENT_BROWSER}
    assert control.current_room(forged, restarted) is None and control.lesson_files(forged, restarted) is None


def test_a_press_in_a_presenter_tab_the_room_moved_past_is_refused_with_why_and_acts_on_what_it_saw(
        tiny_lm, tmp_path) -> None:
    from ui.controllers import step_through as stepper

    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    tab_a: dict = {}
    control.start_class(tab_a, hall, tiny_lm, None, TEACHER)
    tab_b: dict = {}
    control.open_address(tab_b, hall, {"room": tab_a[CLASS.code]}, TEACHER, throttle)
    room = control.current_room(tab_a, hall)
    seen_by_a = room.snapshot.context
    assert control.as_presenter(tab_b, hall, stepper.step, room.snapshot.context)  # tab B steps
    assert len(room.generation.steps) == 1
    assert not control.as_presenter(tab_a, hall, stepper.step, seen_by_a)  # tab A still shows the old room
    assert len(room.generation.steps) == 1 and "another presenter tab" in control.problem(tab_a, "refused")
    assert control.as_presenter(tab_a, hall, stepper.step, room.snapshot.context)  # redrawn: its press acts
    assert len(room.generation.steps) == 2 and control.problem(tab_a, "refused") is None


def test_a_browser_is_known_by_its_xsrf_token_however_the_server_masks_it() -> None:
    """Streamlit's server re-masks its XSRF token with fresh random bytes on every page it sends."""
    from streamlit.web.server.starlette.starlette_app_utils import generate_xsrf_token_string

    from ui.server.class_room import xsrf_token

    token = bytes(range(16))
    first, reloaded = generate_xsrf_token_string(token, 1_700_000_000), generate_xsrf_token_string(token, 1_700_000_000)
    assert first != reloaded and xsrf_token(first) == xsrf_token(reloaded) == token
    assert xsrf_token(token.hex()) == token
    assert xsrf_token("2|zz|00|1") is None and xsrf_token("") is None and xsrf_token(None) is None


def test_a_student_who_reloads_is_the_same_student_with_their_name_and_their_guess(tiny_lm, tmp_path) -> None:
    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    teacher: dict = {}
    control.start_class(teacher, hall, tiny_lm, None, TEACHER)
    code = teacher[CLASS.code]
    first: dict = {}
    control.join(first, hall, code, "Ada", STUDENT_BROWSER, throttle)
    control.guess(first, hall, text="b")
    reloaded: dict = {}
    control.open_address(reloaded, hall, {"room": code}, STUDENT_BROWSER, throttle)
    assert reloaded[CLASS.student] == first[CLASS.student] and reloaded[CLASS.name] == "Ada"
    room = control.current_room(reloaded, hall)
    assert control.my_guess(reloaded, room.snapshot) == control.my_guess(first, room.snapshot)
    control.guess(reloaded, hall, text="c")  # changed before the reveal: still one guess
    assert hall.class_tally(room).total == 1 and hall.store.student_count(code) == 1


def test_a_student_link_made_from_localhost_is_flagged_and_a_network_address_is_not() -> None:
    for url in ("http://localhost:8501/class", "http://127.0.0.1:8501/class", "http://[::1]:8501/class"):
        assert "network address" in control.link_warning(url), url
    for url in ("http://192.168.1.20:8501/class", "https://tokens.example.org/class", "http://teacher-laptop:8501"):
        assert control.link_warning(url) is None, url


def test_the_rooms_generation_is_not_put_away_in_an_idle_spell_so_the_next_step_is_one_pass(
        tiny_lm, tmp_path, idle_server) -> None:
    """A class pauses (a discussion, a break): the first Step after it costs what any Step costs,
    not a replay of every step so far. The room's generation lives as long as the room."""
    from tests.passes import counted_passes
    from ui.controllers import step_through as stepper
    hall = make_hall(tiny_lm, tmp_path / "rooms.sqlite3")
    presenter: dict = {}
    control.start_class(presenter, hall, tiny_lm, None, TEACHER)
    room = control.current_room(presenter, hall)
    for _ in range(3):
        assert control.as_presenter(presenter, hall, stepper.step)
    tab_alone = Generation(tiny_lm, "a visitor's own tab")  # a Step page's generation, for comparison
    idle_rebuild.touch((tab_alone,))
    assert idle_server.away(3600) == 1 and tab_alone.closed  # an hour: the tab's is put away, the room's not
    assert not room.generation.closed
    with counted_passes(tiny_lm) as passes:
        assert control.as_presenter(presenter, hall, stepper.step)
    assert len(room.generation.steps) == 4 and len(passes) == 1


def test_a_guess_from_a_field_drawn_for_a_step_the_room_has_passed_is_not_counted(tiny_lm, tmp_path) -> None:
    hall, throttle = make_hall(tiny_lm, tmp_path / "rooms.sqlite3"), WrongCodeThrottle()
    teacher: dict = {}
    control.start_class(teacher, hall, tiny_lm, None, TEACHER)
    student: dict = {}
    control.join(student, hall, teacher[CLASS.code], None, STUDENT_BROWSER, throttle)
    room = control.current_room(student, hall)
    drawn_for = room.snapshot.context  # as the page's callbacks carry it
    control.guess(student, hall, text="b", context=drawn_for)
    room.generation.step()
    hall.publish(room, room.generation)  # the reveal: a new field, drawn for the new context
    control.guess(student, hall, text="b", context=drawn_for)  # the old field's value, sent again by a rerun
    assert hall.class_tally(room).total == 0 and control.problem(student, "guess") is None
    control.guess(student, hall, text="c", context=room.snapshot.context)
    assert hall.class_tally(room).total == 1


def test_guess_controls_take_a_few_keys_in_turn_and_start_empty_for_each_new_step() -> None:
    state: dict = {}
    first = control.guess_keys(state, "c0")
    state[first[0]], state[first[1]] = 7, " Paris"  # what the student picked and typed for c0
    assert control.guess_keys(state, "c0") == first and state[first[1]] == " Paris"  # the same step: kept
    drawn = [first] + [control.guess_keys(state, f"c{i}") for i in range(1, 3 * control.GUESS_SLOTS)]
    assert len(set(drawn)) == control.GUESS_SLOTS  # a lesson-long page draws a bounded set of keys
    assert all(a != b for a, b in pairwise(drawn))  # the field a reveal replaced keeps its own key
    assert drawn[control.GUESS_SLOTS] == first and state[first[0]] is None and state[first[1]] == ""
    assert len(state[CLASS.guess_slots]) == control.GUESS_SLOTS
