"""The live rooms on a tiny random model: the presenter's secret, publishing, peeking, guesses,
caps, expiry, and a restart that brings every room back with the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from classroom import AccessRefused, ClassHall, ClassLimits, RoomFull, RoomStore
from classroom.hall import REFUSED
from engine import Generation, SamplerSettings, SettingsError, StopSettings, TraceError


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def make_hall(tiny_lm, path: Path, clock: Clock | None = None, **limits) -> ClassHall:
    return ClassHall(RoomStore(path), tiny_lm, ClassLimits(**limits), clock=clock or Clock())


def new_generation(tiny_lm, seed: int = 3) -> Generation:
    return Generation(tiny_lm, "hello there", seed=seed, sampler=SamplerSettings(temperature=0.9),
                      stop=StopSettings(max_new_tokens=12, ignore_eos=True))


def test_the_presenter_secret_opens_the_room_and_a_wrong_one_reads_as_no_room_at_all(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, secret = hall.start(new_generation(tiny_lm))
    assert hall.presenter(room.code, secret) is room
    assert hall.room(room.code.lower()) is room  # as a student types it
    messages = set()
    for code, key in ((room.code, secret[:-2] + "xx"), (room.code, ""), ("ZZZZZZ", secret), ("nonsense!", secret)):
        with pytest.raises(AccessRefused) as refused:
            hall.presenter(code, key)
        messages.add(str(refused.value))
    assert messages == {REFUSED}  # no hint of which rooms exist


def test_the_secret_is_in_no_stored_trace(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, secret = hall.start(new_generation(tiny_lm))
    room.generation.step()
    hall.publish(room, room.generation)
    stored = hall.store.room(room.code)
    assert secret not in stored.trace and secret not in stored.secret_digest
    assert secret.encode() not in (tmp_path / "c.db").read_bytes()


def test_publishing_bumps_the_version_only_when_students_would_see_a_change(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, _ = hall.start(new_generation(tiny_lm))
    assert room.version == 0 and not hall.publish(room, room.generation)
    room.generation.step()
    assert hall.publish(room, room.generation) and room.version == 1
    assert len(room.snapshot.steps) == 1
    before = room.snapshot
    room.generation.sampler = SamplerSettings(temperature=0.5)  # saved, but nothing new to see
    assert hall.publish(room, room.generation)
    assert room.snapshot.steps == before.steps and room.snapshot.context == before.context
    assert '"temperature": 0.5' in hall.store.room(room.code).trace


def test_a_peek_shows_the_next_distribution_and_the_step_after_it_makes_the_same_token(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, _ = hall.start(new_generation(tiny_lm))
    room.generation.step()
    hall.publish(room, room.generation)
    peek = hall.peek(room)
    assert peek is not None and len(room.generation.steps) == 1  # taken and rewound
    assert hall.peek(room) is peek  # once per context
    assert len(room.snapshot.candidates) == 6
    texts = [c.text.strip().lower() for c in room.snapshot.candidates]
    assert texts == sorted(texts)  # alphabetical: the order gives nothing away
    record = room.generation.step()
    assert record.distribution == peek.distribution
    twin = new_generation(tiny_lm)
    assert [twin.step().token_id for _ in range(2)] == room.generation.generated_ids  # as without a peek


def test_guesses_count_their_first_token_once_per_student_and_are_revealed_with_the_models_probability(
        tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, _ = hall.start(new_generation(tiny_lm))
    hall.peek(room)
    candidate = room.snapshot.candidates[0]
    for student in ("a", "b", "c"):
        hall.join(room, student, f"name {student}")
    hall.guess(room, "a", token_id=candidate.token_id)
    hall.guess(room, "b", text="abc")
    hall.guess(room, "b", text="xyz")  # changed before the reveal: one guess each
    first = tiny_lm.tokenizer.encode(" xyz", add_special_tokens=False)[0]  # a new word: its leading space
    hidden = hall.class_tally(room)
    assert hidden.total == 2 and {c.token_id for c in hidden.counts} == {candidate.token_id, first}
    pick = room.generation.step()
    hall.publish(room, room.generation)
    reveal = room.snapshot.reveal
    assert reveal is not None and reveal.index == 1 and reveal.pick.token_id == pick.token_id
    probs = {c.token_id: c.model_prob for c in reveal.tally.counts}
    assert probs[candidate.token_id] == pytest.approx(candidate.prob, rel=1e-5)
    assert room.snapshot.lesson.guesses == 2
    assert hall.class_tally(room).total == 0  # the next token's guesses start empty


def test_a_guess_needs_a_joined_student_and_a_step_to_come(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db", max_guess_chars=5)
    room, _ = hall.start(new_generation(tiny_lm))
    with pytest.raises(ValueError, match="Join the room"):
        hall.guess(room, "stranger", text="hi")
    hall.join(room, "a", "")
    with pytest.raises(RoomFull, match="up to 5 characters; this one has 6"):
        hall.guess(room, "a", text="abcdef")
    with pytest.raises(ValueError, match="not one of this step's"):
        hall.guess(room, "a", token_id=12345)


def test_a_guess_from_controls_drawn_before_the_reveal_is_not_taken_for_the_next_token(tiny_lm, tmp_path) -> None:
    # a page that reruns before it has drawn the reveal sends the old field's value again (bench.class_soak)
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, _ = hall.start(new_generation(tiny_lm))
    hall.join(room, "a", "")
    before = room.snapshot.context
    assert hall.guess(room, "a", text="abc", context=before) is not None
    room.generation.step()
    hall.publish(room, room.generation)
    assert hall.guess(room, "a", text="abc", context=before) is None
    assert hall.guess(room, "a", token_id=12345, context=before) is None  # no refusal to show either
    assert hall.class_tally(room).total == 0 and hall.own_guess(room, "a") is None
    assert hall.guess(room, "a", text="xyz", context=room.snapshot.context) is not None
    assert hall.class_tally(room).total == 1


def test_caps_on_rooms_students_and_names_are_refused_with_the_limit_named(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db", max_rooms=1, max_students=2, max_name_chars=4)
    room, _ = hall.start(new_generation(tiny_lm))
    with pytest.raises(RoomFull, match=r"1 open rooms, its limit \(1\)"):
        hall.start(new_generation(tiny_lm))
    with pytest.raises(RoomFull, match="up to 4 characters"):
        hall.join(room, "a", "Alexandra")
    hall.join(room, "a", "Al")
    hall.join(room, "b", "Bo")
    hall.join(room, "a", "Al")  # a student coming back is no new student
    with pytest.raises(RoomFull, match=r"2 students, its limit \(2\)"):
        hall.join(room, "c", "Cy")


def test_rooms_unused_for_the_idle_time_expire(tiny_lm, tmp_path) -> None:
    clock = Clock()
    hall = make_hall(tiny_lm, tmp_path / "c.db", clock, idle_hours=1)
    room, secret = hall.start(new_generation(tiny_lm))
    clock.now += 3601
    assert hall.expire(force=True) == [room.code]
    with pytest.raises(AccessRefused):
        hall.presenter(room.code, secret)


def test_after_a_restart_every_room_comes_back_with_the_same_tokens_and_both_links(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, secret = hall.start(new_generation(tiny_lm))
    for _ in range(5):
        room.generation.step()
        hall.publish(room, room.generation)
    room.generation.branch(7)  # a forced token survives too
    hall.publish(room, room.generation)
    tokens, version = room.generation.generated_ids, room.version
    hall.store.close()
    restarted = make_hall(tiny_lm, tmp_path / "c.db")
    again = restarted.room(room.code)
    assert again.generation.generated_ids == tokens and again.version == version
    assert restarted.presenter(room.code, secret) is again
    assert again.generation.step().index == 6  # and it goes on


def test_after_a_restart_a_browser_that_showed_the_secret_is_the_presenter_still(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, secret = hall.start(new_generation(tiny_lm))
    hall.trust_browser(room, "cookie:teacher", secret)
    hall.trust_browser(room, "address:10.0.0.7", secret)  # a shared address never counts
    hall.store.close()
    restarted = make_hall(tiny_lm, tmp_path / "c.db")
    assert restarted.trusted_secret(room.code, "cookie:teacher") is None  # the secret itself is not stored
    assert restarted.trusted_presenter(room.code.lower(), "cookie:teacher").code == room.code
    for browser in ("cookie:student", "address:10.0.0.7", ""):
        assert restarted.trusted_presenter(room.code, browser) is None
    assert restarted.trusted_presenter("ZZZZZZ", "cookie:teacher") is None


def test_a_room_whose_stored_trace_is_damaged_is_reported(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, _ = hall.start(new_generation(tiny_lm))
    hall.store.save(room.code, "{not json", 1, 0.0)
    restarted = make_hall(tiny_lm, tmp_path / "c.db")
    with pytest.raises(TraceError, match="could not be rebuilt"):
        restarted.room(room.code)


def test_limits_are_validated_by_name() -> None:
    with pytest.raises(SettingsError, match="max_students"):
        ClassLimits(max_students=0)
    with pytest.raises(SettingsError, match="idle_hours"):
        ClassLimits(idle_hours=-1)


def test_the_board_and_each_students_own_score_count_right_guesses_and_hold_no_names(tiny_lm, tmp_path) -> None:
    hall = make_hall(tiny_lm, tmp_path / "c.db")
    room, _ = hall.start(new_generation(tiny_lm))
    hall.peek(room)
    first, second = room.snapshot.candidates[:2]
    for student in ("a", "b", "c"):
        hall.join(room, student, f"name {student}")
    hall.guess(room, "a", token_id=first.token_id)
    hall.guess(room, "b", token_id=second.token_id)
    pick = room.generation.step()
    hall.publish(room, room.generation)
    snapshot = room.snapshot
    right = {s: int(t == pick.token_id) for s, t in (("a", first.token_id), ("b", second.token_id))}
    assert {s: (o.right, o.guessed) for s, o in snapshot.scores.items()} == {s: (r, 1) for s, r in right.items()}
    [row] = snapshot.board
    assert (row.index, row.text, row.guesses, row.right) == (1, pick.token.text, 2, sum(right.values()))
    assert row.model_prob == pytest.approx(pick.prob)
    assert "name" not in repr(snapshot.board)  # the board counts; it never says who


def test_the_quiz_opens_takes_each_students_answers_once_and_closes(tiny_lm, tmp_path) -> None:
    from classroom.quiz import load_quiz

    store = RoomStore(tmp_path / "c.db")
    hall = ClassHall(store, tiny_lm, ClassLimits(), clock=Clock(), quiz=load_quiz())
    room, _ = hall.start(new_generation(tiny_lm))
    for student in ("a", "b"):
        hall.join(room, student, "")
    with pytest.raises(ValueError, match="The quiz is closed"):
        hall.answer_quiz(room, "a", {0: 1})
    version = room.version
    hall.open_quiz(room, "before")
    assert room.snapshot.quiz_open == "before" and room.version == version + 1
    right = [q.answer for q in hall.quiz]
    hall.answer_quiz(room, "a", dict(enumerate(right)))
    hall.answer_quiz(room, "b", {0: (right[0] + 1) % len(hall.quiz[0].choices)})
    hall.answer_quiz(room, "b", {0: right[0]})  # changed before the close: the latest counts
    with pytest.raises(ValueError, match="not one of the quiz's choices"):
        hall.answer_quiz(room, "a", {0: 99})
    with pytest.raises(ValueError, match="Join the room"):
        hall.answer_quiz(room, "stranger", {0: 0})
    assert hall.quiz_answered(room) == 2 and hall.own_answers(room, "b") == {0: right[0]}
    hall.close_quiz(room)
    assert room.snapshot.quiz_open is None
    hall.open_quiz(room, "after")
    hall.answer_quiz(room, "a", {0: (right[0] + 1) % len(hall.quiz[0].choices)})
    phases = hall.quiz_phases(room)
    assert (phases["before"].students, phases["before"].overall) == (2, 1.0)
    assert phases["before"].per_question[:2] == (1.0, 1.0)
    assert (phases["after"].students, phases["after"].overall) == (1, 0.0)
    again = ClassHall(RoomStore(tmp_path / "c.db"), tiny_lm, ClassLimits(), clock=Clock(), quiz=load_quiz())
    assert again.room(room.code).snapshot.quiz_open == "after"  # a restart keeps the open quiz


def test_the_teachers_download_has_every_guess_by_student_number_and_nothing_secret(tiny_lm, tmp_path) -> None:
    import csv
    import io
    import json

    from classroom.export import lesson_files
    from classroom.quiz import load_quiz

    hall = ClassHall(RoomStore(tmp_path / "c.db"), tiny_lm, ClassLimits(), clock=Clock(), quiz=load_quiz())
    room, secret = hall.start(new_generation(tiny_lm))
    hall.join(room, "cookie:abc123", "=HYPERLINK(\"http://x\")")
    hall.join(room, "cookie:def456", "")
    hall.peek(room)
    hall.guess(room, "cookie:abc123", text="hi")
    hall.guess(room, "cookie:def456", token_id=room.snapshot.candidates[0].token_id)
    pick = room.generation.step()
    hall.publish(room, room.generation)
    room.generation.step()  # a second step no one guessed
    hall.publish(room, room.generation)
    hall.open_quiz(room, "before")
    hall.answer_quiz(room, "cookie:def456", {0: hall.quiz[0].answer})
    files = lesson_files(hall, room)
    for text in (files.json_text, files.csv_text):
        assert secret not in text and room.secret_digest not in text and "abc123" not in text
    record = json.loads(files.json_text)
    first, second = record["steps"]
    assert [g["student"] for g in first["guesses"]] == ["student 1", "student 2"] and second["guesses"] == []
    assert first["token"] == pick.token.text and first["model_probability"] == pytest.approx(pick.prob)
    assert record["summary"]["guesses"] == 2 and record["quiz"]["phases"]["before"]["overall"] == 1.0
    rows = list(csv.DictReader(io.StringIO(files.csv_text)))
    assert len(rows) == 3 and rows[0]["name"].startswith("'=")  # a spreadsheet reads the name as text
    assert rows[2]["step"] == "2" and rows[2]["student"] == ""
