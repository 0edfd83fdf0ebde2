"""The rooms in a real PostgreSQL server (TBT_ROOMS_URL): the same behaviour as the SQLite file,
two halls (two app processes) serving one class, and a database restart mid-lesson."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bench.postgres import fresh_database, restart
from classroom import ClassHall, ClassLimits, StoreError
from classroom.quiz import load_quiz
from classroom.store_pg import PostgresRoomStore
from engine import Generation, SamplerSettings, StopSettings, to_trace


@pytest.fixture()
def store(postgres_url):
    """A store on a fresh database of the session's server, so tests never see each other's rooms."""
    url = fresh_database(postgres_url)
    made = PostgresRoomStore(url)
    made.url = url
    yield made
    made.close()


def until(condition, timeout_s: float = 10.0) -> bool:
    """Whether `condition()` comes true within `timeout_s` (another hall's thread makes it so)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def new_generation(tiny_lm) -> Generation:
    return Generation(tiny_lm, "hello there", seed=3, sampler=SamplerSettings(temperature=0.9),
                      stop=StopSettings(max_new_tokens=20, ignore_eos=True))


def test_rooms_students_guesses_and_the_quiz_are_kept_as_in_the_file(store) -> None:
    store.create("ABC234", "digest", "{}", 1.0)
    assert store.exists("ABC234") and store.room("ABC234").trace == "{}" and store.open_count() == 1
    assert store.join("ABC234", "s1", None, 2.0) == "" and store.join("ABC234", "s1", "Ada", 2.0) == "Ada"
    assert store.join("ABC234", "s1", None, 3.0) == "Ada"  # a reload keeps the name
    store.guess("ABC234", "ctx", "s1", "hi", 5, 4.0)
    store.guess("ABC234", "ctx", "s1", "ho", 6, 5.0)
    [row] = store.guesses("ABC234", ("ctx",))
    assert (row.name, row.text, row.token_id) == ("Ada", "ho", 6) and store.guesses("ABC234", ("other",)) == []
    assert store.save("ABC234", "{}", 1, 6.0) == 1 and store.save("ABC234", "{}", 1, 6.0) == 2  # always onwards
    assert store.bump("ABC234", 7.0) == 3 and store.version("ABC234") == 3
    store.open_quiz("ABC234", "before", 8.0)
    store.answer("ABC234", "before", "s1", {0: 1, 1: 2}, 9.0)
    assert store.open_phase("ABC234") == "before" and len(store.quiz_answers("ABC234")) == 2
    store.close_quiz("ABC234", 10.0)
    assert store.open_phase("ABC234") is None
    for i, browser in enumerate(("cookie:laptop", "cookie:tablet", "cookie:spare", "cookie:tablet")):
        store.trust("ABC234", browser, 11.0 + i, keep=2)  # the tablet again: the newest, one row
    browsers = ("cookie:laptop", "cookie:tablet", "cookie:spare")
    assert [store.trusts("ABC234", b) for b in browsers] == [False, True, True]
    assert store.delete_idle(100.0) == ["ABC234"] and store.guesses("ABC234") == [] and not store.exists("ABC234")


def test_an_unreachable_database_is_reported_without_its_url() -> None:
    url = "postgresql://someone:hunter2@127.0.0.1:1/nowhere"
    with pytest.raises(StoreError) as raised:
        PostgresRoomStore(url)
    assert "cannot be opened" in str(raised.value) and "hunter2" not in str(raised.value)


def test_two_halls_serve_one_class_and_a_students_hall_catches_up_with_each_step(tiny_lm, store) -> None:
    presenter_hall = ClassHall(store, tiny_lm, ClassLimits(), quiz=load_quiz())
    student_hall = ClassHall(PostgresRoomStore(store.url), tiny_lm, ClassLimits(), quiz=load_quiz())
    woken = threading.Event()
    student_hall.on_version(lambda code: woken.set())
    assert student_hall.watch().wait(10), "the students' hall never listened"  # what is announced before is not heard
    room, secret = presenter_hall.start(new_generation(tiny_lm))
    theirs = student_hall.room(room.code)  # rebuilt there from the stored trace
    student_hall.join(theirs, "s1", "Ada")
    for count in (1, 2, 3):
        presenter_hall.peek(room)
        room.generation.step()
        presenter_hall.publish(room, room.generation)
        assert until(lambda count=count: len(theirs.snapshot.steps) == count), "the other process was not told"
        assert theirs.snapshot.steps[-1].token_id == room.generation.steps[-1].token_id
    assert woken.is_set()  # and its own followers were woken
    with theirs.lock:  # a peek on the students' hall's own thread steps and rewinds under the lock
        caught_up = [s["token_id"] for s in to_trace(theirs.generation)["steps"]]
    assert caught_up == [s["token_id"] for s in to_trace(room.generation)["steps"]]
    student_hall.peek(theirs)  # the student's own process gives its students the candidates
    student_hall.guess(theirs, "s1", token_id=theirs.snapshot.candidates[0].token_id)
    assert presenter_hall.class_tally(room).total == 1  # the guess reaches the presenter's process
    presenter_hall.open_quiz(room, "before")
    assert until(lambda: theirs.snapshot.quiz_open == "before")
    student_hall.answer_quiz(theirs, "s1", {0: 0})
    assert presenter_hall.quiz_answered(room) == 1
    assert presenter_hall.presenter(room.code, secret) is room and json.loads(store.room(room.code).trace)["steps"]


def test_a_database_restart_mid_lesson_loses_nothing_and_the_class_goes_on(tiny_lm, store) -> None:
    hall = ClassHall(store, tiny_lm, ClassLimits())
    room, _ = hall.start(new_generation(tiny_lm))
    hall.join(room, "s1", "")
    hall.peek(room)
    hall.guess(room, "s1", token_id=room.snapshot.candidates[0].token_id)
    room.generation.step()
    hall.publish(room, room.generation)
    restart(store.url)
    with pytest.raises(StoreError):  # the statement under way when the server went away fails, said plainly
        store.open_count()
    room.generation.step()
    hall.publish(room, room.generation)  # the next one reconnects
    assert store.room(room.code).version == room.stored_version and len(hall.store.guesses(room.code)) == 1
