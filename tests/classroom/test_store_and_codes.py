"""Room codes, presenter secrets, the SQLite store, the wrong-code slow-down and the tally:
plain data, no model."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from classroom import (
    CODE_ALPHABET,
    CODE_LENGTH,
    Guess,
    RoomStore,
    StoreError,
    WrongCodeThrottle,
    guess_as_typed,
    lesson_score,
    new_code,
    new_secret,
    normalise_code,
    tally,
)
from classroom.codes import secret_digest, secret_matches
from classroom.store import SCHEMA
from classroom.tally import board
from classroom.throttle import FORGET_S, FREE_TRIES, MAX_S


def test_codes_are_random_short_and_from_the_unambiguous_alphabet() -> None:
    codes = [new_code(lambda _: False) for _ in range(200)]
    assert all(len(c) == CODE_LENGTH and set(c) <= set(CODE_ALPHABET) for c in codes)
    assert not set("0O1IL") & set(CODE_ALPHABET)
    assert len(set(codes)) == len(codes)  # 887 million codes: 200 draws never repeat in practice
    assert codes != sorted(codes)  # no sequence


def test_a_new_code_skips_the_codes_taken() -> None:
    taken = {new_code(lambda _: False)}
    seen = []
    code = new_code(lambda c: seen.append(c) or len(seen) < 3)
    assert len(seen) == 3 and code == seen[-1] and code not in taken


def test_a_code_is_read_as_a_student_types_it() -> None:
    assert normalise_code(" abc-def ") == "ABCDEF"
    assert normalise_code("abc def") == "ABCDEF"
    assert normalise_code("ABCDE") is None  # too short
    assert normalise_code("ABCDE0") is None  # 0 is not in the alphabet
    assert normalise_code("<b>xx</b>") is None


def test_secrets_have_at_least_128_bits_and_only_their_digest_is_compared() -> None:
    secret = new_secret()
    assert len(secret) * 6 >= 128 and secret != new_secret()
    digest = secret_digest(secret)
    assert secret not in digest
    assert secret_matches(digest, secret)
    assert not secret_matches(digest, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    assert not secret_matches(digest, "")


def test_the_secret_is_compared_in_constant_time(monkeypatch) -> None:
    import classroom.codes as codes

    calls = []
    real = codes.hmac.compare_digest
    monkeypatch.setattr(codes.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert secret_matches(secret_digest("s"), "s")
    assert len(calls) == 1


def test_the_store_is_in_wal_mode_and_keeps_rooms_students_and_guesses(tmp_path: Path) -> None:
    store = RoomStore(tmp_path / "rooms" / "class.sqlite3")
    assert store.journal_mode == "wal"
    assert store.listen(lambda code: None).is_set()  # nothing to hear: every change is read from the file
    store.create("ABCDEF", "digest", '{"t": 1}', now=100.0)
    store.join("ABCDEF", "s1", "Ada", now=101.0)
    store.join("ABCDEF", "s1", "Ada L.", now=102.0)  # again: the name is updated, one student
    store.guess("ABCDEF", "ctx", "s1", "Paris", 42, now=103.0)
    store.guess("ABCDEF", "ctx", "s1", "Rome", 43, now=104.0)  # changed before the reveal
    store.close()
    again = RoomStore(tmp_path / "rooms" / "class.sqlite3")  # a restart
    row = again.room("ABCDEF")
    assert row is not None and row.trace == '{"t": 1}' and row.secret_digest == "digest"
    assert again.student_count("ABCDEF") == 1
    [guess] = again.guesses("ABCDEF", ("ctx",))
    assert (guess.name, guess.text, guess.token_id) == ("Ada L.", "Rome", 43)


def test_idle_rooms_are_deleted_with_their_guesses(tmp_path: Path) -> None:
    store = RoomStore(tmp_path / "class.sqlite3")
    store.create("AAAAAA", "d", "{}", now=0.0)
    store.create("BBBBBB", "d", "{}", now=0.0)
    store.touch("BBBBBB", now=50.0)
    store.join("AAAAAA", "s", "", now=0.0)
    store.guess("AAAAAA", "c", "s", "x", 1, now=0.0)
    assert store.delete_idle(before=10.0) == ["AAAAAA"]
    assert store.room("AAAAAA") is None and store.guesses("AAAAAA") == [] and store.open_count() == 1


def test_one_rooms_guesses_never_appear_in_another(tmp_path: Path) -> None:
    store = RoomStore(tmp_path / "class.sqlite3")
    for code in ("AAAAAA", "BBBBBB"):
        store.create(code, "d", "{}", now=0.0)
        store.join(code, "s", f"name in {code}", now=0.0)
    store.guess("AAAAAA", "same context", "s", "only in A", 5, now=0.0)
    assert [g.text for g in store.guesses("AAAAAA")] == ["only in A"]
    assert store.guesses("BBBBBB") == [] and store.guesses("BBBBBB", ("same context",)) == []



def test_a_lessons_guesses_are_read_with_one_statement_whatever_its_length(tmp_path: Path) -> None:
    """Each step's guesses are read on every Step for every step so far: a statement per lesson
    length would each stay prepared in the connection's cache (hundreds of MB in a long lesson)."""
    store = RoomStore(tmp_path / "c.db")
    store.create("AAAAAA", "d", "{}", 0.0)
    contexts = tuple(f"ctx{i}" for i in range(300))
    for i, context in enumerate(contexts[::3]):
        store.guess("AAAAAA", context, "s", f"g{i}", i, float(i))
    store.guess("AAAAAA", "off the path", "s", "x", 1, 0.0)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    for length in (1, 2, 300):
        expected = [f"g{i}" for i in range((length + 2) // 3)]  # every third context was guessed
        assert [g.text for g in store.guesses("AAAAAA", contexts[:length])] == expected
    texts = {re.sub(r"'(?:[^']|'')*'", "?", s) for s in statements if "FROM guesses" in s}  # values left out
    assert len(texts) == 1


def test_the_presenters_browsers_are_kept_the_newest_few_and_go_with_their_room(tmp_path: Path) -> None:
    store = RoomStore(tmp_path / "class.sqlite3")
    store.create("AAAAAA", "d", "{}", now=0.0)
    for i, browser in enumerate(("cookie:laptop", "cookie:tablet", "cookie:spare")):
        store.trust("AAAAAA", browser, float(i), keep=2)
    store.trust("AAAAAA", "cookie:tablet", 5.0, keep=2)  # again: the newest now, still one row
    store.close()
    again = RoomStore(tmp_path / "class.sqlite3")  # a restart
    browsers = ("cookie:laptop", "cookie:tablet", "cookie:spare")
    assert [again.trusts("AAAAAA", b) for b in browsers] == [False, True, True]
    assert not again.trusts("BBBBBB", "cookie:tablet")  # per room
    again.delete_idle(before=10.0)
    assert again._db.execute("SELECT COUNT(*) FROM presenter_browsers").fetchone()[0] == 0


def test_a_database_of_an_older_schema_gains_the_new_tables(tmp_path: Path) -> None:
    path = tmp_path / "class.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA.split("CREATE TABLE IF NOT EXISTS presenter_browsers")[0] + "PRAGMA user_version = 2;")
        db.execute("INSERT INTO rooms VALUES ('AAAAAA', 'd', 0, 0, 0, '{}')")
    store = RoomStore(path)
    store.trust("AAAAAA", "cookie:laptop", 1.0, keep=4)
    assert store.trusts("AAAAAA", "cookie:laptop") and store.room("AAAAAA") is not None


def test_a_corrupt_database_file_is_reported_not_raised_as_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "class.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot be opened"):
        RoomStore(path)


def test_a_database_of_another_schema_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "class.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 7")
    with pytest.raises(StoreError, match="schema version 7"):
        RoomStore(path)


def test_a_database_that_cannot_be_created_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot be opened"):
        RoomStore(blocker / "class.sqlite3")  # a folder under a file


def test_a_missing_database_file_is_made_anew(tmp_path: Path) -> None:
    store = RoomStore(tmp_path / "new" / "class.sqlite3")
    assert store.open_count() == 0


def test_repeated_wrong_codes_from_one_browser_are_slowed_down_and_a_right_one_clears_them() -> None:
    throttle = WrongCodeThrottle()
    for _ in range(FREE_TRIES):
        assert throttle.wait_left("browser", now=0.0) == 0.0
        throttle.failed("browser", now=0.0)
    assert throttle.wait_left("browser", now=0.0) == 0.0  # three typos cost nothing
    throttle.failed("browser", now=0.0)
    first = throttle.wait_left("browser", now=0.0)
    throttle.failed("browser", now=first)
    second = throttle.wait_left("browser", now=first)
    assert 0 < first < second <= MAX_S  # each wrong try doubles the wait
    assert throttle.wait_left("another browser", now=first) == 0.0
    for _ in range(20):
        throttle.failed("browser", now=first)
    assert throttle.wait_left("browser", now=first) == MAX_S
    assert throttle.wait_left("browser", now=first + FORGET_S + 1) == 0.0  # forgotten after a while
    throttle.failed("x", now=0.0)
    throttle.succeeded("x")
    assert throttle.wait_left("x", now=0.0) == 0.0


def test_a_typed_guess_is_a_new_word_after_a_word() -> None:
    assert guess_as_typed("Paris", "The capital of France is") == " Paris"
    assert guess_as_typed("  Paris ", "is") == " Paris"
    assert guess_as_typed(",", "is") == ","
    assert guess_as_typed("Paris", "is ") == "Paris"
    assert guess_as_typed("Paris", "") == "Paris"


def test_the_tally_counts_by_token_and_the_lesson_score_compares_the_class_with_the_model() -> None:
    guesses = [Guess("a", "Ada", "Paris", 1), Guess("b", "", "paris", 1), Guess("c", "Cy", "Rome", 2)]
    result = tally(guesses, {1: " Paris", 2: " Rome"}.__getitem__, {1: 0.77, 2: 0.01}.__getitem__)
    assert [(c.text, c.count, c.names, c.model_prob) for c in result.counts] == [
        (" Paris", 2, ("Ada",), 0.77), (" Rome", 1, ("Cy",), 0.01)]
    assert result.total == 3 and result.right(1) == 2 and result.right(9) == 0
    hidden = tally(guesses, str)
    assert all(c.model_prob is None for c in hidden.counts)
    rows = board([(1, " Paris", 0.77), (5, " the", 0.2), (7, " x", 0.5)], [guesses, [], [Guess("a", "", "x", 3)]])
    score = lesson_score(rows)
    assert (score.steps, score.guesses, score.right) == (2, 4, 2)
    assert score.class_accuracy == 0.5 and score.model_mean_prob == pytest.approx((0.77 + 0.5) / 2)


def test_a_database_of_the_first_schema_gains_the_quiz_tables_and_keeps_its_rooms(tmp_path: Path) -> None:
    path = tmp_path / "class.sqlite3"
    store = RoomStore(path)
    store.create("ABC234", "digest", "{}", 1.0)
    store.close()
    with sqlite3.connect(path) as db:  # as the first schema left it
        db.executescript("DROP TABLE quiz_answers; DROP TABLE quiz_phases; PRAGMA user_version = 1;")
    again = RoomStore(path)
    assert again.exists("ABC234") and again.open_phase("ABC234") is None
    again.open_quiz("ABC234", "before", 2.0)
    assert again.open_phase("ABC234") == "before"


@pytest.mark.parametrize(("edit", "words"), [
    (lambda q: q.update(answer=9), "Question 1 of the quiz file: \"answer\" must be the right choice's number"),
    (lambda q: q.update(choices=["only one"]), "Question 1 of the quiz file needs 2 to 6 choices"),
    (lambda q: q.update(question=""), "Question 1 of the quiz file: the question, each choice and \"why\""),
])
def test_a_quiz_file_edited_wrongly_is_refused_naming_the_question(tmp_path: Path, edit, words) -> None:
    import json

    from classroom.quiz import QUIZ_FILE, QuizError, load_quiz

    assert 5 <= len(load_quiz()) <= 8  # the shipped quiz
    data = json.loads(QUIZ_FILE.read_text())
    edit(data["questions"][0])
    path = tmp_path / "quiz.json"
    path.write_text(json.dumps(data))
    with pytest.raises(QuizError, match=re.escape(words)):
        load_quiz(path)
