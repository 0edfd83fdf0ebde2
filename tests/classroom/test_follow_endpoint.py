"""The follow endpoint (classroom/follow.py) as a browser meets it: a real uvicorn server on a free
port and real HTTP requests. It answers at once when the page is behind, holds a page that is up to
date until the room moves on, caps what it holds, and says the version with the view every
student shares of it (built once per version, escaped) and nothing else, the same for every code
it will not answer."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from classroom import ClassHall, ClassLimits, RoomStore
from classroom.follow import NOT_FOUND, FollowApp, FollowLimits, follow_token, serve
from engine import Generation, SamplerSettings, SettingsError, StopSettings
from ui.server.follow_endpoint import follow_settings, student_view

KEY = b"k" * 32
CODE = "ABCDEF"


class Served:
    """A FollowApp over a plain table of room versions, served on a free local port."""

    def __init__(self, limits: FollowLimits, view_of=None) -> None:
        self.versions: dict[str, int] = {CODE: 3}
        self.app = FollowApp(self.versions.get, KEY, limits, view_of)
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = serve(self.app, sock)

    def publish(self, code: str, version: int) -> None:
        self.versions[code] = version
        self.app.announce(code)

    def get(self, path: str, origin: str | None = None, timeout: float = 10) -> tuple[int, bytes, dict[str, str]]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        connection.request("GET", path, headers={"Origin": origin} if origin else {})
        response = connection.getresponse()
        answer = response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
        connection.close()
        return answer


def poll(code: str = CODE, after: int = 3, token: str | None = None) -> str:
    return f"/rooms/{code}/version?token={token or follow_token(KEY, code)}&after={after}"


@pytest.fixture()
def served():
    endpoint = Served(FollowLimits(hold_s=1.0, per_room=2, total=3))
    yield endpoint
    endpoint.server.should_exit = True


def held(served: Served, count: int) -> None:
    """Wait until `count` requests are held."""
    deadline = time.monotonic() + 5
    while served.app.waits.total != count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.app.waits.total == count


def test_a_page_behind_the_room_is_answered_at_once_with_the_version(served) -> None:
    started = time.monotonic()
    status, body, _ = served.get(poll(after=1))
    assert (status, json.loads(body)) == (200, {"version": 3})
    assert time.monotonic() - started < 1.0  # not held for hold_s
    assert served.get(poll(after=-1))[:2] == (200, b'{"version": 3}')  # a page that drew nothing yet


def test_an_up_to_date_page_is_held_until_the_room_publishes(served) -> None:
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(served.get, poll(after=3))
        held(served, 1)
        assert not answer.done()
        served.publish(CODE, 4)
        status, body, _ = answer.result(timeout=2)
    assert (status, json.loads(body)) == (200, {"version": 4})
    assert served.app.waits.total == 0


def test_a_held_page_gets_the_version_as_it_is_when_the_hold_ends(served) -> None:
    status, body, _ = served.get(poll(after=3))  # hold_s = 1
    assert (status, json.loads(body)) == (200, {"version": 3})


def test_another_rooms_version_does_not_wake_a_page(served) -> None:
    served.versions["GHJKMN"] = 0
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(served.get, poll(after=3))
        held(served, 1)
        served.publish("GHJKMN", 1)
        time.sleep(0.3)
        assert not answer.done()
        served.publish(CODE, 5)
        assert json.loads(answer.result(timeout=2)[1]) == {"version": 5}


def test_held_requests_are_capped_per_room_and_in_all(served) -> None:
    served.versions["GHJKMN"] = 0
    with ThreadPoolExecutor(3) as pool:
        first = [pool.submit(served.get, poll(after=3)) for _ in range(2)]
        held(served, 2)
        status, _, headers = served.get(poll(after=3))  # the room's cap (2)
        assert status == 429 and headers["retry-after"] == "10"
        other = pool.submit(served.get, poll("GHJKMN", after=0))
        held(served, 3)
        assert served.get(poll("GHJKMN", after=0))[0] == 429  # the total cap (3)
        served.publish(CODE, 4)
        served.publish("GHJKMN", 1)
        assert [f.result(timeout=2)[0] for f in [*first, other]] == [200, 200, 200]
    assert served.get(poll(after=1))[0] == 200  # freed


def test_a_page_that_leaves_frees_its_place(served) -> None:
    with socket.create_connection(("127.0.0.1", served.port)) as gone:
        gone.sendall(f"GET {poll(after=3)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        held(served, 1)
    held(served, 0)


def test_the_answer_carries_the_version_and_nothing_else(served) -> None:
    status, body, headers = served.get(poll(after=0), origin="http://127.0.0.1:8501")
    assert status == 200 and json.loads(body) == {"version": 3}
    assert headers["content-type"] == "application/json" and headers["cache-control"] == "no-store"
    assert headers["access-control-allow-origin"] == "http://127.0.0.1:8501"  # the app's page, another port
    assert "set-cookie" not in headers
    assert "access-control-allow-origin" not in served.get(poll(after=0), origin="https://elsewhere.example")[2]


def test_a_new_version_comes_with_its_view_built_and_encoded_once_for_every_page() -> None:
    built: list[int] = []

    def view_of(code: str) -> tuple[int, str]:
        built.append(endpoint.versions[code])
        return endpoint.versions[code], f"<p>version {endpoint.versions[code]}</p>"

    endpoint = Served(FollowLimits(hold_s=1.0), view_of)
    try:
        answers = [json.loads(endpoint.get(poll(after=after))[1]) for after in (0, 1, 2)]
        assert answers == [{"version": 3, "view": "<p>version 3</p>"}] * 3 and built == [3]
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(endpoint.get, poll(after=3))
            held(endpoint, 1)
            endpoint.publish(CODE, 4)
            assert json.loads(answer.result(timeout=2)[1]) == {"version": 4, "view": "<p>version 4</p>"}
        assert built == [3, 4]
        assert json.loads(endpoint.get(poll(after=4))[1]) == {"version": 4}  # held to the end: no news, no view
    finally:
        endpoint.server.should_exit = True


def test_a_view_older_than_the_version_is_not_sent_as_that_version() -> None:
    endpoint = Served(FollowLimits(hold_s=1.0), lambda code: (2, "<p>old</p>"))
    try:
        assert json.loads(endpoint.get(poll(after=0))[1]) == {"version": 3}  # the page's rerun draws it
    finally:
        endpoint.server.should_exit = True


def test_the_view_sent_is_the_students_shared_view_with_every_text_escaped(tiny_lm, tmp_path) -> None:
    hall = ClassHall(RoomStore(tmp_path / "c.db"), tiny_lm, ClassLimits())
    room, secret = hall.start(Generation(tiny_lm, '<img src=x onerror="alert(1)">', seed=3,
                                         stop=StopSettings(max_new_tokens=4, ignore_eos=True)))
    room.generation.step()
    hall.publish(room, room.generation)
    version, view = student_view(hall, room.code)
    assert version == room.version
    assert 'data-steps="1"' in view and "&lt;img" in view and "<img" not in view
    assert secret not in view
    assert student_view(hall, "ZZZZZZ") is None


def test_a_wrong_code_a_wrong_token_and_an_expired_room_get_the_same_answer(served) -> None:
    served.versions["GHJKMN"] = 2
    answers = {served.get(path)[:2] for path in (
        poll("ZZZZZZ"),  # no such room
        poll(token=follow_token(b"another process", CODE)),  # a token from a restarted server
        poll(token=follow_token(KEY, "GHJKMN")),  # another room's token
        f"/rooms/{CODE}/version?after=0",  # none
        "/rooms/abc/version?token=x&after=0", "/elsewhere")}
    del served.versions["GHJKMN"]
    answers.add(served.get(poll("GHJKMN", after=0))[:2])  # expired
    assert answers == {(404, NOT_FOUND)}
    assert served.get(poll(after="x"))[0] == 400  # type: ignore[arg-type]


def test_a_room_that_expires_while_a_page_waits_answers_as_a_wrong_code(served) -> None:
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(served.get, poll(after=3))
        held(served, 1)
        del served.versions[CODE]
        served.app.announce(CODE)
        assert answer.result(timeout=2)[:2] == (404, NOT_FOUND)


def test_limits_name_a_bad_value() -> None:
    with pytest.raises(SettingsError, match="hold_s"):
        FollowLimits(hold_s=0)
    with pytest.raises(SettingsError, match="per_room"):
        FollowLimits(per_room=0)


def test_the_hall_announces_every_new_version_a_student_would_read(tiny_lm, tmp_path) -> None:
    hall = ClassHall(RoomStore(tmp_path / "c.db"), tiny_lm, ClassLimits())
    room, _ = hall.start(Generation(tiny_lm, "hello there", seed=3, sampler=SamplerSettings(temperature=0.9),
                                    stop=StopSettings(max_new_tokens=4, ignore_eos=True)))
    heard: list[tuple[str, int | None]] = []
    hall.on_version(lambda code: heard.append((code, hall.version(code))))
    room.generation.step()
    hall.publish(room, room.generation)  # the reveal
    hall.peek(room)  # the candidates
    assert not hall.publish(room, room.generation)  # nothing new: no announcement
    assert heard == [(room.code, 1), (room.code, 2)] and room.version == 2
    assert hall.version("ZZZZZZ") is None and hall.version(room.code.lower()) is None  # exact codes only


def test_threads_announcing_at_once_wake_a_held_page(served) -> None:
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(served.get, poll(after=3))
        held(served, 1)
        threads = [threading.Thread(target=served.publish, args=(CODE, 4 + i)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert json.loads(answer.result(timeout=2)[1])["version"] >= 4


def test_the_port_is_streamlits_plus_one_unless_set_and_bad_settings_are_named() -> None:
    assert follow_settings({}, 8501, None).port == 8502
    assert follow_settings({}, 8501, None).host == "0.0.0.0"  # where Streamlit listens by default
    assert follow_settings({"TBT_FOLLOW_PORT": "0"}, 8501, "127.0.0.1").port == 0  # off
    behind = follow_settings({"TBT_FOLLOW_PORT": "9000", "TBT_FOLLOW_URL": "https://x.org/follow/"}, 8501, None)
    assert (behind.port, behind.public_url) == (9000, "https://x.org/follow")
    for variable, value in (("TBT_FOLLOW_PORT", "-1"), ("TBT_FOLLOW_PORT", "70000"), ("TBT_FOLLOW_URL", "x.org")):
        with pytest.raises(SettingsError, match=variable):
            follow_settings({variable: value}, 8501, None)
