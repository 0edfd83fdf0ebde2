"""What a teacher takes home from a lesson: every revealed token with the model's probability and
every guess (with the student's name where one was given), the class's and the model's scores,
the hardest and easiest tokens, and the quiz's before / after results, as JSON and as CSV.

Only the presenter's page asks for it (ui/controllers/class_room.py `lesson_files` checks the
secret first). Students appear as "student 1", "student 2"… in the order they first guessed,
with the display name they chose, if any; nothing here holds a browser's id, the room's secret
or its digest.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import asdict, dataclass

from classroom.hall import ClassHall, LiveRoom
from classroom.tally import HUMAN_SOURCE, HUMAN_TOP1, lesson_summary


@dataclass(frozen=True)
class LessonFiles:
    """The lesson as a download: one JSON document and one CSV table (a row per guess, and a row
    for each revealed step that no one guessed)."""

    name: str  # a file name without its extension
    json_text: str
    csv_text: str


CSV_COLUMNS = ("step", "token", "model_probability", "student", "name", "guess", "guessed_token", "right")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet would run a cell starting so as a formula


def lesson_record(hall: ClassHall, room: LiveRoom) -> dict:
    """The lesson so far as plain data (see the module's docstring)."""
    with room.lock:
        generation, snapshot, steps = room.generation, room.snapshot, list(room.generation.steps)
        per_step = hall.step_guesses(room.code, generation)
    numbers: dict[str, int] = {}
    for row in (row for rows in per_step for row in rows):  # a step's guesses all come before the next's
        numbers.setdefault(row.student, len(numbers) + 1)
    summary = lesson_summary(snapshot.board, len(numbers))
    record = {
        "room": room.code, "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(hall.clock())),
        "prompt": generation.prompt_text, "output": generation.output_text,
        "summary": {
            "tokens": summary.tokens, "students_who_guessed": summary.students, "guesses": summary.score.guesses,
            "class_top1": summary.score.class_accuracy, "model_mean_probability": summary.score.model_mean_prob,
            "people_top1_published": HUMAN_TOP1, "people_source": HUMAN_SOURCE,
            "hardest": [asdict(row) for row in summary.hardest], "easiest": [asdict(row) for row in summary.easiest],
        },
        "steps": [{
            "step": step.index, "token": step.token.text, "model_probability": step.prob,
            "guesses": [{"student": f"student {numbers[g.student]}", "name": g.name, "guess": g.text,
                         "guessed_token": hall.lm.texts.piece(g.token_id).text, "right": g.token_id == step.token_id}
                        for g in rows],
        } for step, rows in zip(steps, per_step, strict=True)],
    }
    if (quiz := hall.quiz_results(room)) is not None:
        record["quiz"] = quiz
    return record


def lesson_files(hall: ClassHall, room: LiveRoom) -> LessonFiles:
    record = lesson_record(hall, room)
    return LessonFiles(file_name(hall, room), as_json(record), as_csv(record))


def file_name(hall: ClassHall, room: LiveRoom) -> str:
    """The download's name without its extension: the room and when."""
    return f"lesson-{room.code}-{time.strftime('%Y%m%d-%H%M', time.gmtime(hall.clock()))}"


def as_json(record: dict) -> str:
    return json.dumps(record, indent=1, ensure_ascii=False)


def as_csv(record: dict) -> str:
    """A row per guess (a step no one guessed: one row with the guess columns empty)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for step in record["steps"]:
        first = (step["step"], as_cell(step["token"]), f"{step['model_probability']:.6f}")
        for guess in step["guesses"] or [None]:
            writer.writerow(first + (("", "", "", "", "") if guess is None else (
                guess["student"], as_cell(guess["name"]), as_cell(guess["guess"]), as_cell(guess["guessed_token"]),
                int(guess["right"]))))
    return out.getvalue()


def as_cell(text: str) -> str:
    """Text a student typed, as a spreadsheet cell that stays text: a leading ' before what a
    spreadsheet would read as a formula (the JSON keeps the text as typed)."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
