"""Secrets stay sealed, against the real server (issue #44, item 6): one `streamlit run app.py` with its
own rooms database and follow endpoint, and visitors that speak Streamlit's own websocket protocol
(bench/streamlit_client.py), each with its own browser cookie. A presenter runs a whole lesson (the
quiz before, guesses, three steps to the end, the quiz after, the download) while two students
follow it; then students, a visitor with no room and forged links send what a presenter's page
would send, and the room must not move. Every message a student's page received, the links and
the QR code, the follow endpoint's answers, the teacher's files and the server's log are searched
for the presenter's secret and for what only the download holds.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import re
import secrets
import sqlite3
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.appserver import free_port, served_app_process
from bench.streamlit_client import Visitor, rerun_message
from classroom.codes import secret_digest
from classroom.hall import REFUSED
from tests.browser.conftest import ARTIFACTS
from ui.session.keys import CLASS, STEP

pytestmark = pytest.mark.model  # the server loads the real model; no Chromium here
PAGE = "class"
MAX_STUDENTS = 3  # the room's cap, and so the follow endpoint's held requests per room
MAX_CHARS = 40  # a guess's and a name's (ClassLimits' defaults)
OPEN_TIMEOUT_S = 180.0  # the first page loads the model
STEP_KEY, RUN_KEY, BACK_KEY, RESET_KEY = (CLASS.presenter + key for key in (STEP.step, STEP.run, STEP.back,
                                                                              STEP.reset))
PRESENTER_BUTTONS = (STEP_KEY, RUN_KEY, BACK_KEY, RESET_KEY, CLASS.quiz_before, CLASS.quiz_after, CLASS.quiz_close)
NAMES = ("Ada Zephyrine", "Bob Quixote")  # found nowhere but on their own screens, the presenter's and the download

def run_alone(coroutine):
    """`coroutine` on an event loop of its own thread: in the whole suite, Playwright's sync API
    keeps a loop running in this one, where asyncio.run refuses to start."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()



# ---- a browser without the browser -------------------------------------------------------------


@dataclass
class Browser(Visitor):
    """A headless visitor that keeps every message its page received (references resolved)."""

    received: list[ForwardMsg] = field(default_factory=list)

    def _resolve(self, msg: ForwardMsg) -> ForwardMsg:
        resolved = super()._resolve(msg)
        self.received.append(resolved)
        return resolved

    async def rerun(self, msg: BackMsg, button_keys: tuple[str, ...] = ()):
        """As a Visitor's, noting every presenter button the run draws too (a click enables others)."""
        return await super().rerun(msg, (*button_keys, *PRESENTER_BUTTONS, CLASS.leave))

    def everything(self) -> str:
        """All it received as text: every message's bytes, and the images sent inline, decoded."""
        raw = b"".join(msg.SerializeToString() for msg in self.received).decode("latin-1")
        inline = [base64.b64decode(data).decode("latin-1")
                  for data in re.findall(r"data:[\w/+.-]+;base64,([\w+/=]+)", raw)]
        return "\n".join([raw, *inline])

    def widget(self, key: str, prefix: bool = False) -> tuple[str, str]:
        """(widget id, fragment id) of the widget with this key (or key prefix) as last drawn."""
        for msg in reversed(self.received):
            if msg.WhichOneof("type") == "delta" and msg.delta.WhichOneof("type") == "new_element":
                element = msg.delta.new_element
                widget_id = getattr(getattr(element, element.WhichOneof("type")), "id", "")
                drawn_key = widget_id.split("-", 2)[2] if widget_id.startswith("$$ID-") else None
                if drawn_key is not None and (drawn_key.startswith(key) if prefix else drawn_key == key):
                    return widget_id, msg.delta.fragment_id
        raise AssertionError(f"no widget {key!r} on this page")

    def drawn(self, kind: str) -> list:
        """Every element of this kind the page received."""
        return [getattr(msg.delta.new_element, kind) for msg in self.received if msg.WhichOneof("type") == "delta"
                and msg.delta.WhichOneof("type") == "new_element" and msg.delta.new_element.WhichOneof("type") == kind]

    def widgets_message(self, *widgets: tuple[str, str, object], fragment_id: str = "") -> BackMsg:
        """A rerun carrying these widget states ((id, field, value): what a page, or a forger, sends)."""
        msg = rerun_message(self.query_string, self.page_script_hash, fragment_id=fragment_id, url=self.url)
        for widget_id, kind, value in widgets:
            state = msg.rerun_script.widget_states.widgets.add()
            state.id = widget_id
            setattr(state, kind, value)
        return msg

    async def submit(self, *widgets: tuple[str, str, object], fragment_id: str = ""):
        """Send these widget states and wait for the run they start."""
        return await self.rerun(self.widgets_message(*widgets, fragment_id=fragment_id))

    async def reload(self):
        """Run the whole page again (what a rerun of it sends, with no widget changed)."""
        return await self.rerun(rerun_message(self.query_string, self.page_script_hash, url=self.url))

    async def follow(self):
        """One tick of the follow fragment's timer (what the follow element's trigger also asks for)."""
        [fragment] = self.auto_reruns
        return await self.auto_rerun(fragment)

    def follow_path(self) -> tuple[int, str]:
        """The follow endpoint's port and path this page polls (/rooms/<code>/version?token=…)."""
        [data] = [c.data for c in self.components.values() if isinstance(c.data, dict) and "path" in c.data]
        return data["port"], data["path"]


async def visit(url: str, query: str = "", buttons: tuple[str, ...] = (), cookie: str | None = None) -> Browser:
    """A browser of its own (its own XSRF cookie, which the server knows it by) opening /class?query."""
    return await Browser.open(url, query, timeout=OPEN_TIMEOUT_S, button_keys=buttons, page_name=PAGE,
                              cookie=f"_streamlit_xsrf={cookie or secrets.token_hex(16)}")


async def http_get(url: str, port: int, path: str, timeout: float = 30) -> tuple[int, dict[str, str], str]:
    """One GET, as a page's fetch sends it: its status, headers and body."""
    host = urlsplit(url).hostname
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = (await asyncio.wait_for(reader.read(), timeout)).decode("latin-1")
    finally:
        writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


async def close(*pages: Browser) -> None:
    for page in pages:
        await page.close()


def shown(browser_or_result) -> str:
    """What a run (or a whole page) showed as text, Markdown's escapes read as a visitor reads them."""
    texts = browser_or_result.texts if hasattr(browser_or_result, "texts") else ()
    return re.sub(r"\\(.)", r"\1", "\n".join([*texts, *browser_or_result.errors])).replace("\u2060", "")


def is_presenter(browser: Browser) -> bool:
    """Whether the page drew the presenter's controls or a presenter link."""
    return STEP_KEY in browser.buttons or any("&key=" in code.code_text for code in browser.drawn("code"))


def is_student(browser: Browser) -> bool:
    """Whether the page drew a student's room (its Leave button)."""
    return CLASS.leave in browser.buttons


# ---- the server and the lesson -----------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    url: str
    db: Path
    log: Path
    secrets: list[str] = field(default_factory=list)  # of every room started on it: none may reach its log


@dataclass
class Lesson:
    code: str
    secret: str
    presenter: Browser
    students: tuple[Browser, Browser]
    student_link: str
    qr_svg: str  # the QR code the presenter's page showed, as SVG
    endpoint_answers: list[str]  # every body the follow endpoint gave the students' pages
    csv: str
    json: str
    finished_text: str  # what a student's page showed at the end


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("sealed") / "class.sqlite3"
    log = ARTIFACTS / "class_sealed_streamlit.log"
    env = {"TBT_CLASS_DB": str(db), "TBT_FOLLOW_PORT": str(free_port()), "TBT_CLASS_MAX_STUDENTS": str(MAX_STUDENTS),
           "PYTHONUNBUFFERED": "1"}  # the log as it happens, not at exit
    with served_app_process(log, env=env) as (url, _pid):
        yield Server(url, db, log)


def room_state(server: Server, code: str) -> tuple:
    """The room as stored: its version and trace, its students, guesses and quiz."""
    queries = ("SELECT version, trace FROM rooms WHERE code = ?",
               "SELECT student, name FROM students WHERE code = ? ORDER BY student",
               "SELECT context, student, text FROM guesses WHERE code = ? ORDER BY 1, 2",
               "SELECT phase, closed IS NULL FROM quiz_phases WHERE code = ? ORDER BY 1",
               "SELECT student, question, choice FROM quiz_answers WHERE code = ? ORDER BY 1, 2")
    with sqlite3.connect(f"file:{server.db}?mode=ro", uri=True) as db:
        return tuple(db.execute(query, (code,)).fetchall() for query in queries)


async def start_class(server: Server) -> tuple[Browser, str, str]:
    """A presenter presses Start a class; returns its page, the room's code and its secret."""
    presenter = await visit(server.url, buttons=(CLASS.start,))
    await presenter.click(CLASS.start)
    await presenter.reload()
    code = presenter.query_string.removeprefix("room=")
    [link] = [c.code_text for c in presenter.drawn("code") if "&key=" in c.code_text][-1:]
    server.secrets.append(link.split("&key=", 1)[1])
    return presenter, code, server.secrets[-1]


async def ask_for_file(browser: Browser, file_id: str):
    """What a download button's click asks the server for: the deferred file `file_id`, made now.
    Returns the server's answer (its URL, or why not)."""
    ask = BackMsg()
    ask.backend_operation_request.request_id = file_id
    ask.backend_operation_request.session_id = next(  # the page's own session, as the frontend sends it
        m.new_session.initialize.session_id for m in browser.received if m.WhichOneof("type") == "new_session")
    ask.backend_operation_request.deferred_file.file_id = file_id
    await browser.send(ask)
    while True:
        msg = ForwardMsg()
        msg.ParseFromString(await asyncio.wait_for(browser.connection.recv(), 60))
        browser.received.append(msg)
        if msg.WhichOneof("type") == "backend_operation_response":
            return msg.backend_operation_response


async def fetch_download(server: Server, presenter: Browser, key: str) -> str:
    """What the presenter's download button gives: the file made when it is clicked."""
    [button] = [b for b in presenter.drawn("download_button") if b.id.endswith("-" + key)][-1:]
    answer = await ask_for_file(presenter, button.deferred_file_id)
    assert not answer.error_msg, answer.error_msg
    with urllib.request.urlopen(server.url + answer.deferred_file.url, timeout=30) as response:
        return response.read().decode()


async def run_lesson(server: Server) -> Lesson:
    url = server.url
    presenter, code, secret = await start_class(server)
    max_tokens, _ = presenter.widget(CLASS.presenter + STEP.max_new_tokens)
    await presenter.submit((max_tokens, "int_value", 3))  # a short lesson: 3 tokens
    students = (await visit(url, f"room={code}"), await visit(url, f"room={code}"))
    answers: list[str] = []

    async def students_follow() -> None:
        for student in students:
            await student.follow()
            port, path = student.follow_path()
            answers.append((await http_get(url, port, f"{path}&after=-1"))[2])

    async def quiz(phase: str) -> None:  # the presenter opens it, a student answers, the presenter closes it
        await presenter.click(CLASS.quiz_before if phase == "before" else CLASS.quiz_after)
        await students_follow()
        first, fragment = students[0].widget(f"{CLASS.quiz_choice}{phase}_0")
        send, _ = students[0].widget(CLASS.quiz_send)
        [choices] = [radio.options for radio in students[0].drawn("radio") if radio.id == first][-1:]
        sent = await students[0].submit((first, "string_value", choices[1]), (send, "trigger_value", True),
                                      fragment_id=fragment)
        assert "Answers sent" in shown(sent), shown(sent)
        await presenter.click(CLASS.quiz_close)

    for student, name in zip(students, NAMES, strict=True):
        await student.type_text(CLASS.name, name)
    await quiz("before")
    for _ in range(3):  # a guess from each student, then the reveal, to the end
        await students_follow()
        for student, guess in zip(students, (" Paris", "the"), strict=True):
            guess_field, fragment = student.widget(CLASS.guess_text, prefix=True)
            await student.submit((guess_field, "string_value", guess), fragment_id=fragment)
        await presenter.click(STEP_KEY)
    await quiz("after")
    await students_follow()
    finished_text = students[0].everything()
    await presenter.reload()
    [student_link] = {c.code_text for c in presenter.drawn("code") if "&key=" not in c.code_text}
    [qr] = {image.url for images in presenter.drawn("imgs") for image in images.imgs}
    lesson = Lesson(code, secret, presenter, students, student_link,
                    base64.b64decode(qr.split("base64,", 1)[1]).decode(), answers,
                    await fetch_download(server, presenter, CLASS.download_csv),
                    await fetch_download(server, presenter, CLASS.download_json), finished_text)
    # a browser opening the presenter link asks the server for the page with the secret in its address
    with urllib.request.urlopen(f"{url}/{PAGE}?room={code}&key={secret}", timeout=30) as response:
        assert response.status == 200
    await close(presenter, *students)
    return lesson


@pytest.fixture(scope="module")
def lesson(server: Server) -> Lesson:
    return run_alone(run_lesson(server))


# ---- 1. the presenter's secret and the teacher's download reach no student ---------------------


def test_the_lesson_ran_to_its_end_with_guesses_names_and_both_quizzes(lesson) -> None:
    """The searches below mean something only if the lesson did what a lesson does."""
    assert re.search(r'data-steps=\\*"3\\*"', lesson.finished_text) and "finished: " in lesson.finished_text
    record = json.loads(lesson.json)
    assert len(record["steps"]) == 3 and record["summary"]["guesses"] == 6
    assert set(record["quiz"]["phases"]) == {"before", "after"}
    assert all(name in lesson.csv and name in lesson.json for name in NAMES)
    assert lesson.secret in lesson.presenter.everything()  # the presenter link, on the presenter's screen


def test_no_students_page_holds_the_secret_or_anything_of_the_download(lesson) -> None:
    deferred = [button.deferred_file_id for button in lesson.presenter.drawn("download_button")]
    only_in_download = [lesson.secret, secret_digest(lesson.secret), "step,token,model_probability,student",
                        "students_who_guessed", f"lesson-{lesson.code}-", "student 1", *deferred]
    for student, own_name, other_name in zip(lesson.students, NAMES, reversed(NAMES), strict=True):
        received = student.everything()
        assert len(student.received) > 100 and own_name in received  # every message of the lesson
        for text in [*only_in_download, other_name]:
            assert text not in received, text
        assert not student.drawn("download_button") and not is_presenter(student) and is_student(student)


def test_the_student_link_and_its_qr_code_carry_the_code_and_no_secret(lesson) -> None:
    from ui.views.class_room import qr_svg

    assert urlsplit(lesson.student_link).query == f"room={lesson.code}"
    assert lesson.qr_svg == qr_svg(lesson.student_link)  # the QR code is the student link's, nothing more
    assert lesson.qr_svg != qr_svg(f"{lesson.student_link}&key={lesson.secret}")
    assert lesson.secret not in lesson.qr_svg


def test_the_follow_endpoint_answers_carry_the_version_and_neither_secret_nor_names(lesson) -> None:
    assert len(lesson.endpoint_answers) >= 8
    for body in lesson.endpoint_answers:
        assert isinstance(json.loads(body)["version"], int), body
        for text in (lesson.secret, *NAMES, "student 1"):
            assert text not in body, (text, body)


def test_the_teachers_files_hold_no_secret_digest_or_browser_id(lesson) -> None:
    for text in (lesson.csv, lesson.json):
        assert lesson.secret not in text and secret_digest(lesson.secret) not in text
        assert "cookie:" not in text and "session:" not in text and "address:" not in text


# ---- 2. a student cannot step, reveal, open the quiz or download by crafting requests ------------


async def endpoint_version(url: str, student: Browser) -> int:
    port, path = student.follow_path()
    return json.loads((await http_get(url, port, f"{path}&after=-1"))[2])["version"]


async def settled(url: str, student: Browser, server: Server, code: str) -> int:
    """The room's version once the peek after the latest step has put out its candidates."""
    stored = room_state(server, code)[0][0][0]
    for _ in range(100):
        if (version := await endpoint_version(url, student)) > stored:
            return version
        await asyncio.sleep(0.1)
    raise AssertionError("the room never peeked")


async def forge_the_presenters_widgets(server: Server) -> None:
    url = server.url
    presenter, code, _ = await start_class(server)
    await presenter.click(STEP_KEY)  # one token out: Step, Back and Reset would each change the room
    student, lobby = await visit(url, f"room={code}"), await visit(url)
    version = await settled(url, student, server, code)
    before = room_state(server, code)
    widgets = {key: presenter.widget(key) for key in (*PRESENTER_BUTTONS, CLASS.download_csv, CLASS.download_json)}
    prompt, _ = presenter.widget(CLASS.presenter + STEP.prompt)
    max_tokens, _ = presenter.widget(CLASS.presenter + STEP.max_new_tokens)
    peek, _ = presenter.widget(CLASS.peek_answer)  # the presenter's private look at the answer and the names
    deferred = [button.deferred_file_id for button in presenter.drawn("download_button")]
    for forger in (student, lobby):
        forger.timeout = 30.0
        for widget_id, fragment in widgets.values():
            await forger.submit((widget_id, "trigger_value", True))  # the click in a run of the whole page
            # and in a run of the presenter's fragment, which this session does not have (it runs nothing)
            await forger.send(forger.widgets_message((widget_id, "trigger_value", True), fragment_id=fragment))
        await forger.submit((prompt, "string_value", "Forged prompt"), (max_tokens, "int_value", 1),
                            (peek, "bool_value", True))
        # the session's own state keys, sent as if they were widgets
        await forger.submit((CLASS.role, "string_value", "presenter"), (CLASS.code, "string_value", code),
                            (CLASS.secret, "string_value", "forged"))
        answer = await ask_for_file(forger, secrets.token_hex(16))  # a download with an id it was never given
        assert answer.error_msg and not answer.deferred_file.url
        await forger.reload()
        assert not is_presenter(forger) and not forger.drawn("download_button")
        assert not any(file_id in forger.everything() for file_id in deferred)
        assert "hidden from the class" not in forger.everything()
    assert room_state(server, code) == before and await endpoint_version(url, student) == version
    assert is_student(student) and not is_student(lobby)
    await presenter.click(BACK_KEY)  # the presenter's own press does move it: the checks above can see a move
    assert room_state(server, code) != before
    await close(presenter, student, lobby)


def test_a_student_or_a_visitor_without_a_room_sending_the_presenters_widgets_moves_nothing(server) -> None:
    run_alone(forge_the_presenters_widgets(server))


# ---- 3. a wrong secret makes no presenter; a student link cannot be made a presenter link --------


async def forge_presenter_links(server: Server) -> None:
    url = server.url
    presenter, code, secret = await start_class(server)
    someone, other_code, other_secret = await start_class(server)  # who started a room of their own
    student = await visit(url, f"room={code}")
    token = student.follow_path()[1].split("token=", 1)[1]
    other = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    forged = {"one character off": f"room={code}&key={other}", "cut short": f"room={code}&key={secret[:-1]}",
              "another room's secret": f"room={code}&key={other_secret}",
              "this room's secret on another room": f"room={other_code}&key={secret}",
              "the follow token": f"room={code}&key={token}", "the code": f"room={code}&key={code}",
              "the stored digest": f"room={code}&key={secret_digest(secret)}",
              "the secret twice over": f"room={code}&key={secret}{secret}"}
    for what, query in forged.items():
        page = await visit(url, query)  # a browser of its own: the slow-down is another test's
        assert not is_presenter(page) and not is_student(page), what
        assert REFUSED in shown(page), (what, shown(page))
        assert "key=" not in page.query_string, what  # the address bar drops it, right or wrong
        await page.close()
    empty = await visit(url, f"room={code}&key=")
    assert is_student(empty) and not is_presenter(empty)  # an empty key is the student link
    right = await visit(url, f"room={code}&key={secret}")
    assert is_presenter(right) and "key=" not in right.query_string  # the right one does make a presenter
    await close(presenter, someone, student, empty, right)


def test_a_wrong_secret_makes_no_presenter_and_a_student_link_cannot_be_made_one(server) -> None:
    run_alone(forge_presenter_links(server))


# ---- 4. rate limits hold -------------------------------------------------------------------------


async def join_by_form(page: Browser, code: str, name: str = ""):
    field_id, _ = page.widget(CLASS.join_code)
    name_id, _ = page.widget(CLASS.name)
    join, _ = page.widget(CLASS.join)
    return await page.submit((field_id, "string_value", code), (name_id, "string_value", name),
                           (join, "trigger_value", True))


async def wrong_codes_slowed(server: Server) -> None:
    url = server.url
    presenter, code, secret = await start_class(server)
    cookie = secrets.token_hex(16)
    for _ in range(2):  # wrong codes in the address and in the join form count alike, per browser
        wrong = await visit(url, "room=ZZZZZZ", cookie=cookie)
        assert REFUSED in shown(wrong)
        await wrong.close()
    page = await visit(url, cookie=cookie)
    for _ in range(2):
        assert REFUSED in shown(await join_by_form(page, "ZZZZZZ"))
    slowed = await join_by_form(page, code)  # the right code now waits too
    assert "Too many wrong codes from this browser: try again in" in shown(slowed) and not is_student(page)
    again = await visit(url, f"room={code}&key={secret}", cookie=cookie)  # and so does the right secret
    assert "Too many wrong codes" in shown(again) and not is_presenter(again) and not is_student(again)
    elsewhere = await visit(url, f"room={code}")  # another browser is not slowed
    assert is_student(elsewhere)
    await close(presenter, page, again, elsewhere)


def test_repeated_wrong_codes_and_secrets_from_one_browser_are_slowed_and_others_are_not(server) -> None:
    run_alone(wrong_codes_slowed(server))


async def caps_hold(server: Server) -> None:
    url = server.url
    presenter, code, _ = await start_class(server)
    students = [await visit(url, f"room={code}") for _ in range(MAX_STUDENTS)]
    # what a browser's max_chars would stop, sent anyway: kept to the cap
    guess_field, fragment = students[0].widget(CLASS.guess_text, prefix=True)
    await students[0].submit((guess_field, "string_value", "x" * 5000), fragment_id=fragment)
    name_field, _ = students[0].widget(CLASS.name)
    await students[0].submit((name_field, "string_value", "N" * 5000))
    _, names, guesses, _, _ = room_state(server, code)
    assert guesses and all(len(text) <= MAX_CHARS for _, _, text in guesses)
    assert "N" * MAX_CHARS in {name for _, name in names} and all(len(name) <= MAX_CHARS for _, name in names)
    late = await visit(url, f"room={code}")  # one student over the room's cap
    assert f"This room already has {MAX_STUDENTS} students, its limit ({MAX_STUDENTS})." in shown(late)
    assert not is_student(late) and len(room_state(server, code)[1]) == MAX_STUDENTS
    # the follow endpoint holds at most the room's student cap of requests at once; one more: 429 at once
    port, path = students[0].follow_path()
    version = await endpoint_version(url, students[0])
    held = [asyncio.create_task(http_get(url, port, f"{path}&after={version}")) for _ in range(MAX_STUDENTS)]
    await asyncio.sleep(0.5)
    assert not any(task.done() for task in held)
    status, headers, _ = await http_get(url, port, f"{path}&after={version}", timeout=5)
    assert status == 429 and headers["retry-after"] == "10"
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    # and it answers no one who has not the room's token, whatever code they try
    token = path.split("token=", 1)[1]
    other = token[:-1] + ("A" if token[-1] != "A" else "B")
    for wrong in (f"/rooms/{code}/version?token={other}&after=-1", f"/rooms/{code}/version?after=-1",
                  f"/rooms/ZZZZZZ/version?token={token}&after=-1"):
        assert (await http_get(url, port, wrong, timeout=5))[0] == 404
    await close(presenter, late, *students)


def test_length_caps_the_students_cap_and_the_follow_endpoints_cap_hold_against_crafted_requests(server) -> None:
    run_alone(caps_hold(server))


# ---- and the server's log, after everything above -------------------------------------------------


def test_the_servers_log_holds_no_secret_and_nothing_of_the_download(server, lesson) -> None:
    """Run last: the log of every request above (the presenter link's page and websocket, forged
    links and widgets, refused downloads) holds no room's secret and nothing of the download."""
    log = server.log.read_text()
    assert urlsplit(server.url).netloc in log  # the server's own output is what was read
    assert lesson.secret in server.secrets  # and every room the tests before this one started
    for text in (*server.secrets, *map(secret_digest, server.secrets), *NAMES, "students_who_guessed",
                 "model_probability"):
        assert text not in log, text
