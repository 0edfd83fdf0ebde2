"""The Class page's views of a room: what every student sees carries counts and never a name;
each student's own score and the presenter's summary say what the records hold."""

from __future__ import annotations

import dataclasses

from classroom import ClassHall, ClassLimits, RoomStore
from classroom.tally import OwnScore
from engine import Generation, SamplerSettings, StopSettings
from ui.controllers.class_room import summary
from ui.views import class_room
from ui.views.class_room import follow_html, lesson_html, own_score_html, summary_html


def revealed_room(tiny_lm, tmp_path):
    hall = ClassHall(RoomStore(tmp_path / "c.db"), tiny_lm, ClassLimits())
    room, _ = hall.start(Generation(tiny_lm, "hello there", seed=3, sampler=SamplerSettings(temperature=0.9),
                                    stop=StopSettings(max_new_tokens=8, ignore_eos=True)))
    for step in range(3):
        hall.peek(room)
        for student, name in (("a", "Ada Lovelace"), ("b", "Bob Stone")):
            hall.join(room, student, name)
            hall.guess(room, student, token_id=room.snapshot.candidates[step % 2].token_id)
        room.generation.step()
        hall.publish(room, room.generation)
    return hall, room


def test_what_every_student_sees_has_the_class_counts_and_no_name(tiny_lm, tmp_path) -> None:
    _, room = revealed_room(tiny_lm, tmp_path)
    above, below = follow_html(room.snapshot)
    for text in (above, below):
        assert "Ada Lovelace" not in text and "Bob Stone" not in text
    assert "What the class guessed, beside the model's probability" in below and " of 2</b> guesses named it" in below
    assert below.count("<tr><td class='num'>") == 3  # the board: three revealed steps, the newest first
    assert below.index("<td class='num'>3</td>") < below.index("<td class='num'>1</td>")


def test_a_students_own_score_and_the_presenters_summary_say_what_the_records_hold(tiny_lm, tmp_path) -> None:
    hall, room = revealed_room(tiny_lm, tmp_path)
    snapshot = room.snapshot
    assert own_score_html(OwnScore(2, 3)).count("<b>2 of 3</b>") == 1 and own_score_html(None) == ""
    lesson = summary(snapshot)
    assert lesson.tokens == 3 and lesson.students == 2 and lesson.score.guesses == 6
    hardest = lesson.hardest[0]
    assert hardest.right / hardest.guesses == min(r.right / r.guesses for r in snapshot.board)
    shown = summary_html(lesson, hall.quiz_phases(room))
    assert "<b>6</b> guesses from <b>2</b> students" in shown and "Hardest for the class" in shown
    assert lesson_html(snapshot.lesson, ()).count("<table") == 0  # the score alone before any board row



def test_a_room_keeps_only_its_newest_views_built(tiny_lm, tmp_path) -> None:
    """Each view holds the whole context: a long lesson must not keep one per Step."""
    _, room = revealed_room(tiny_lm, tmp_path)
    first = room.snapshot
    versions = [dataclasses.replace(first, version=first.version + i) for i in range(4)]
    views = [follow_html(snapshot) for snapshot in versions]
    assert follow_html(versions[-1]) is views[-1] and follow_html(versions[-2]) is views[-2]  # built once
    assert follow_html(versions[0]) == views[0]  # a page still on an old version: built again, not kept
    assert sorted(class_room._views[first.code]) == [v.version for v in versions[-class_room.KEPT_VERSIONS:]]
