"""The Class page's controller on plain state (no Streamlit): who a returning browser is."""

from __future__ import annotations

from classroom import WrongCodeThrottle
from tests.classroom.test_hall import make_hall
from ui import class_controller as control
from ui.keys import CLASS

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
