"""What the Class page's controls do, as plain functions over the visitor's state.

`state` is st.session_state on the page and a dict in tests; the keys are ui/session/keys.py's CLASS.
Who may change a room is decided here, on the server, from this session's own state: a session
becomes the presenter only by showing the room's secret (`open_address`, `start_class`), and
every change to the room goes through `as_presenter`, which refuses any other session whatever
its page showed. The presenter drives the room's one Generation with the Step page's own
controller (ui/controllers/step_through.py) on `presenter_state(state)`: the Step page's keys, kept under
the Class page's prefix, so the presenter's own Step page is untouched.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from classroom import AccessRefused, ClassHall, LiveRoom, RoomFull, Snapshot, StoreError, WrongCodeThrottle
from classroom.export import LessonFiles, as_csv, as_json, file_name, lesson_record
from classroom.tally import LessonSummary, OwnScore, lesson_summary
from engine import Generation, LoadedModel, PromptError, SettingsError, TraceError
from engine.serving import ForwardScheduler
from ui.controllers import step_through as step_controller
from ui.session import idle_rebuild
from ui.session.keys import CLASS, STEP
from ui.session.settings import init_defaults, message, set_message, write_generation

State = MutableMapping[str, Any]
PRESENTER, STUDENT = "presenter", "student"
NOT_PRESENTER = "Only the room's presenter can change it: this page follows the presenter's screen."
MOVED_ON = ("The room moved on in another presenter tab (it is at {count} tokens now): this screen shows it now. "
            "Press again to go on from here.")
# what a room cannot be opened for: a wrong code or secret, a full room, an unreadable store or trace
GUESS_SLOTS = 3  # sets of guess controls a student's page draws in turn (guess_keys)
OPEN_ERRORS = (AccessRefused, RoomFull, StoreError, TraceError)


class ScopedState(MutableMapping[str, Any]):
    """A view of session state in which every key is read and written under a prefix: the Step
    page's controller works on it unchanged, and its keys never meet the Step page's own."""

    def __init__(self, base: MutableMapping[str, Any], prefix: str) -> None:
        self.base, self.prefix = base, prefix

    def key(self, name: str) -> str:
        """The widget key under which `name` lives in the base state."""
        return self.prefix + name

    def __getitem__(self, name: str) -> Any:
        return self.base[self.prefix + name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.base[self.prefix + name] = value

    def __delitem__(self, name: str) -> None:
        del self.base[self.prefix + name]

    def __iter__(self) -> Iterator[str]:
        return (key[len(self.prefix):] for key in list(self.base) if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def presenter_state(state: State) -> ScopedState:
    """The presenter's Step-page state inside this session's state."""
    return ScopedState(state, CLASS.presenter)


def role(state: Mapping[str, Any]) -> str | None:
    return state.get(CLASS.role)


def problem(state: State, control: str) -> str | None:
    return message(state, control, CLASS.messages)


def _say(state: State, control: str, text: str | None) -> None:
    set_message(state, control, text, CLASS.messages)


LOCAL_HOSTS = ("localhost", "127.", "::1", "[::1]", "0.0.0.0")


def link_warning(url: str) -> str | None:
    """Why students' phones cannot open a link made from this address, if they cannot: the
    page was opened as this computer itself (localhost), which on a phone means the phone."""
    host = urlsplit(url).hostname or ""
    if not any(host == local or host.startswith(local) for local in LOCAL_HOSTS):
        return None
    return (f"This page was opened as {host}, so the link and QR code point at each student's own device. "
            "Open the app at this computer's network address (for example http://192.168.1.20:8501, the "
            "'Network URL' the server printed when it started) and start the class from there.")


# ---- entering a room -------------------------------------------------------------------------


def start_class(state: State, hall: ClassHall, lm: LoadedModel, scheduler: ForwardScheduler | None,
                browser: str = "") -> None:
    """Start a class: a room on a generation from the Step page's default settings, and this
    session (and this browser's reloads and tabs) its presenter."""
    presenter = presenter_state(state)
    init_defaults(presenter)
    try:
        room, secret = hall.start(step_controller.new_generation(presenter, lm, scheduler))
    except (RoomFull, StoreError, SettingsError, PromptError) as exc:
        _say(state, "start", str(exc))
        return
    _say(state, "start", None)
    _become_presenter(state, room, secret)
    hall.trust_browser(room, browser, secret)


def _become_presenter(state: State, room: LiveRoom, secret: str | None, browser: str = "") -> None:
    """This session drives the room: by its secret, or (`secret` None) by its browser, which
    the store trusts from before a restart."""
    state.update({CLASS.role: PRESENTER, CLASS.code: room.code})
    if secret is not None:
        state[CLASS.secret] = secret
        state.pop(CLASS.presenter_browser, None)
    else:
        state.pop(CLASS.secret, None)
        state[CLASS.presenter_browser] = browser
    presenter = presenter_state(state)
    init_defaults(presenter)
    write_generation(presenter, room.generation)  # the widgets show the room's settings


def open_address(state: State, hall: ClassHall, params: Mapping[str, str], browser: str,
                 throttle: WrongCodeThrottle, now: float | None = None) -> None:
    """On a session's first run, a room link in the address: `room` alone makes a student,
    `room` and `key` (the secret) the presenter. A wrong one is refused, and counted against
    this browser like a wrong code. A browser that showed the secret before (a reload, a second
    tab, a laptop waking up, the server restarted since) opens `room` alone as presenter again:
    the server remembers it."""
    if state.get(CLASS.address_read):
        return
    state[CLASS.address_read] = True
    if "room" not in params:
        return
    secret = params.get("key") or hall.trusted_secret(params["room"], browser)
    if secret:
        if (room := _checked(state, throttle, browser, now, lambda: hall.presenter(params["room"], secret))):
            _become_presenter(state, room, secret)
            hall.trust_browser(room, browser, secret)
        return
    if (room := hall.trusted_presenter(params["room"], browser)) is not None:  # after a restart
        _become_presenter(state, room, None, browser)
        return
    join(state, hall, params["room"], None, browser, throttle, now)


def join(state: State, hall: ClassHall, code_text: str, name: str | None, browser: str,
         throttle: WrongCodeThrottle, now: float | None = None) -> None:
    """Join a room as a student with its code (and an optional display name; none keeps the
    name this browser gave the room before, so a reload is the same student with their name)."""
    room = _checked(state, throttle, browser, now, lambda: hall.room(code_text))
    if room is None:
        return
    student = state.get(CLASS.student) or _student_id(browser)
    try:
        stored = hall.join(room, student, name or None)
    except (RoomFull, StoreError) as exc:
        _say(state, "join", str(exc))
        return
    state.update({CLASS.role: STUDENT, CLASS.code: room.code, CLASS.student: student, CLASS.name: stored})
    if (guessed := hall.guess_of(room, student)) is not None:  # a reload shows the guess it made
        state[CLASS.my_guess] = (room.snapshot.context, guessed)
    state.pop(CLASS.secret, None)
    state.pop(CLASS.presenter_browser, None)


def _checked(state: State, throttle: WrongCodeThrottle, browser: str, now: float | None,
             open_room: Callable[[], LiveRoom]) -> LiveRoom | None:
    """The room `open_room` finds, unless this browser must wait after wrong tries or the try
    is wrong (then the message beside the join form says so, and nothing else)."""
    now = time.monotonic() if now is None else now
    if (wait := throttle.wait_left(browser, now)) > 0:
        _say(state, "join", f"Too many wrong codes from this browser: try again in {wait:.0f} s.")
        return None
    try:
        room = open_room()
    except AccessRefused as exc:
        throttle.failed(browser, now)
        _say(state, "join", str(exc))
        return None
    except OPEN_ERRORS as exc:
        _say(state, "join", str(exc))
        return None
    throttle.succeeded(browser)
    _say(state, "join", None)
    return room


def _student_id(browser: str) -> str:
    """The same browser is the same student when it comes back (a reload makes a new session);
    a client that sends no cookie is a new student each session."""
    return browser if browser.startswith("cookie:") else "session:" + secrets.token_hex(8)


def leave(state: State) -> None:
    """Leave the room (this session only; the room stays)."""
    for key in (CLASS.role, CLASS.code, CLASS.secret, CLASS.presenter_browser, CLASS.my_guess):
        state.pop(key, None)
    presenter = presenter_state(state)
    presenter.pop(STEP.generation, None)


# ---- the room this session is in -------------------------------------------------------------


def current_room(state: State, hall: ClassHall) -> LiveRoom | None:
    """This session's room (the presenter's secret, or its browser's trust, checked again on
    every run); None, with the message beside the join form, when it is gone."""
    code = state.get(CLASS.code)
    if code is None:
        return None
    try:
        if role(state) == PRESENTER:
            return _room_by_presenters_right(state, hall, code)
        return hall.room(code)
    except OPEN_ERRORS as exc:
        leave(state)
        _say(state, "join", str(exc))
        return None


def _room_by_presenters_right(state: State, hall: ClassHall, code: str) -> LiveRoom:
    """The room, by the secret this session holds, or by its browser's stored trust."""
    if CLASS.secret in state or CLASS.presenter_browser not in state:
        return hall.presenter(code, state.get(CLASS.secret, ""))
    if (room := hall.trusted_presenter(code, state[CLASS.presenter_browser])) is None:
        raise AccessRefused
    return room


def presenter_link_known(state: State) -> bool:
    """Whether this presenter's session holds the room's secret (a session the store's trust
    made presenter after a restart does not: the server keeps the secret's digest only)."""
    return bool(state.get(CLASS.secret))


def as_presenter(state: State, hall: ClassHall, action: Callable[[State], object],
                 seen: str | None = None) -> bool:
    """Run a Step-page action (`action(presenter_state)`) on the room's generation, then
    publish the result to every student. Refused for any session that is not the presenter,
    and, when `seen` (the room's context this screen showed) is given, if another presenter tab
    moved the room on since: a press acts on what the presenter saw, or says why not."""
    room = current_room(state, hall) if role(state) == PRESENTER else None
    if room is None:
        _say(state, "refused", NOT_PRESENTER)
        return False
    presenter = presenter_state(state)
    with room.lock:  # one change at a time, and never during a peek
        if seen is not None and seen != room.snapshot.context:
            _say(state, "refused", MOVED_ON.format(count=len(room.generation.steps)))
            return False
        _say(state, "refused", None)
        presenter[STEP.generation] = room.generation
        action(presenter)
        if (generation := presenter.get(STEP.generation)) is not None:
            hall.publish(room, generation)
            # the room's generation lives as long as the room (the hall closes it): a tab's
            # idle release would make the first Step after a pause replay every step first
            idle_rebuild.exempt(room.generation)
    return True


def presenter_generation(state: State, hall: ClassHall, lm: LoadedModel, scheduler: ForwardScheduler | None
                         ) -> tuple[LiveRoom, Generation] | None:
    """On each presenter run: the room and its generation, brought up to the setup widgets
    (a new prompt starts over, for the whole room) and published."""
    room = current_room(state, hall) if role(state) == PRESENTER else None
    if room is None:
        return None
    as_presenter(state, hall, lambda presenter: step_controller.sync_generation(presenter, lm, scheduler))
    return room, room.generation


# ---- students --------------------------------------------------------------------------------


def follow(state: State, hall: ClassHall) -> Snapshot | None:
    """A follower's check: the room's current snapshot (this student noted as connected)."""
    room = current_room(state, hall)
    if room is None:
        return None
    if (student := state.get(CLASS.student)) is not None:
        hall.seen(room, student)
    return room.snapshot


def guess(state: State, hall: ClassHall, text: str | None = None, token_id: int | None = None,
          context: str | None = None) -> None:
    """This student's guess for the next token (typed, or a candidate chip), from controls drawn
    for `context` (the room's context key then): a field the room has moved past since is
    ignored (ClassHall.guess says why)."""
    room = current_room(state, hall) if role(state) == STUDENT else None
    if room is None:
        _say(state, "guess", "Join a room as a student to guess.")
        return
    try:
        piece = hall.guess(room, state[CLASS.student], text=text, token_id=token_id, context=context)
    except (ValueError, RoomFull, StoreError) as exc:
        _say(state, "guess", str(exc))
        return
    if piece is None:  # an old step's field, sent again with a rerun: no guess, nothing to say
        return
    _say(state, "guess", None)
    state[CLASS.my_guess] = (room.snapshot.context, piece.text)


def guess_keys(state: State, context: str) -> tuple[str, str]:
    """The keys of the guess controls (candidate chips, text field) drawn for `context`.

    A page uses GUESS_SLOTS sets of keys in turn, not one per step: Streamlit keeps a record of
    every widget key a session has drawn until the session ends, so a key per step grew each
    student's session by two records a step, the whole lesson long. A slot given to a new context
    starts empty (nothing typed or picked for an earlier step shows, nor counts), and it is the
    oldest context's slot, so a field the reveal replaced is still known as its own step's while
    a browser may send it again (the callbacks carry the context they were drawn for)."""
    slots: dict[str, int] = state.setdefault(CLASS.guess_slots, {})
    if context not in slots:
        free = sorted(set(range(GUESS_SLOTS)) - set(slots.values()))
        slots[context] = free[0] if free else slots.pop(next(iter(slots)))
        pick, text = _slot_keys(slots[context])
        state[pick], state[text] = None, ""
    return _slot_keys(slots[context])


def _slot_keys(slot: int) -> tuple[str, str]:
    return f"{CLASS.guess_pick}{slot}", f"{CLASS.guess_text}{slot}"


def my_guess(state: Mapping[str, Any], snapshot: Snapshot) -> str | None:
    """The token this student guessed for the snapshot's next token, if any."""
    kept = state.get(CLASS.my_guess)
    return kept[1] if kept and kept[0] == snapshot.context else None


def rename(state: State, hall: ClassHall, name: str) -> None:
    """A student's display name (at most the room's cap, plain text)."""
    room = current_room(state, hall) if role(state) == STUDENT else None
    if room is None:
        return
    try:
        hall.join(room, state[CLASS.student], name)
    except (RoomFull, StoreError) as exc:
        _say(state, "name", str(exc))
        return
    _say(state, "name", None)


def summary(snapshot: Snapshot) -> LessonSummary:
    """The lesson so far, as its end-of-lesson summary."""
    return lesson_summary(snapshot.board, len(snapshot.scores))


def own_score(state: Mapping[str, Any], snapshot: Snapshot) -> OwnScore | None:
    """This student's own score (never another's: each page reads its own id only)."""
    return snapshot.scores.get(state.get(CLASS.student)) if role(state) == STUDENT else None


# ---- the quiz and the lesson's download ---------------------------------------------------------


def _presenters_room(state: State, hall: ClassHall) -> LiveRoom | None:
    """The room, for the presenter only (the secret checked again); else None and the refusal said."""
    room = current_room(state, hall) if role(state) == PRESENTER else None
    if room is None:
        _say(state, "refused", NOT_PRESENTER)
    return room


def open_quiz(state: State, hall: ClassHall, phase: str) -> None:
    """The presenter opens the quiz before (or after) the lesson on every student's screen."""
    if (room := _presenters_room(state, hall)) is None:
        return
    try:
        hall.open_quiz(room, phase)
    except (ValueError, StoreError) as exc:
        _say(state, "quiz", str(exc))
        return
    _say(state, "quiz", None)


def close_quiz(state: State, hall: ClassHall) -> None:
    if (room := _presenters_room(state, hall)) is None:
        return
    try:
        hall.close_quiz(room)
    except StoreError as exc:
        _say(state, "quiz", str(exc))


def answer_quiz(state: State, hall: ClassHall, answers: Mapping[int, int | None]) -> None:
    """A student's answers to the open quiz (questions left unanswered are skipped)."""
    room = current_room(state, hall) if role(state) == STUDENT else None
    if room is None:
        _say(state, "quiz", "Join a room as a student to answer its quiz.")
        return
    try:
        hall.answer_quiz(room, state[CLASS.student], {q: c for q, c in answers.items() if c is not None})
    except (ValueError, StoreError) as exc:
        _say(state, "quiz", str(exc))
        return
    _say(state, "quiz", None)
    state[CLASS.quiz_sent] = room.snapshot.quiz_open


def own_answers(state: State, hall: ClassHall) -> dict[int, int]:
    """This student's answers to the open quiz, as stored."""
    room = current_room(state, hall) if role(state) == STUDENT else None
    return {} if room is None else hall.own_answers(room, state[CLASS.student])


@dataclass(frozen=True)
class LessonDownload:
    """The presenter's download: its name, and what makes each file when the button is clicked
    (not on every run of the presenter's page: each reads every guess of the lesson)."""

    name: str
    csv: Callable[[], str]
    json: Callable[[], str]


def lesson_download(state: State, hall: ClassHall) -> LessonDownload | None:
    """The lesson's download, for the presenter alone (the secret checked again): any other
    session gets None."""
    room = current_room(state, hall) if role(state) == PRESENTER else None
    if room is None:
        return None
    return LessonDownload(file_name(hall, room), lambda: as_csv(lesson_record(hall, room)),
                          lambda: as_json(lesson_record(hall, room)))


def lesson_files(state: State, hall: ClassHall) -> LessonFiles | None:
    """The lesson as CSV and JSON now, for the presenter alone: any other session gets None."""
    download = lesson_download(state, hall)
    return None if download is None else LessonFiles(download.name, download.json(), download.csv())
