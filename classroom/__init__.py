"""A class in one room: the presenter steps one generation, every student follows and guesses.

No Streamlit here (the Class page, pages/class.py, is a view of it): room codes and
presenter secrets (`codes.py`), the rooms' SQLite store (`store.py`), guesses and their tallies
(`tally.py`: also the lesson's board, each student's own score and the summary), the quiz before
and after a lesson (`quiz.py`), the teacher's download (`export.py`), the slow-down of repeated
wrong codes (`throttle.py`) and the live rooms of one server process (`hall.py`), each room's
generation rebuilt from its trace with the engine's exact replay after a restart.
"""

from classroom.codes import CODE_ALPHABET, CODE_LENGTH, SECRET_BYTES, new_code, new_secret, normalise_code
from classroom.hall import AccessRefused, ClassHall, ClassLimits, LiveRoom, Peek, RoomFull, Snapshot
from classroom.store import RoomStore, StoreError
from classroom.tally import Guess, GuessCount, LessonScore, Tally, guess_as_typed, lesson_score, tally
from classroom.throttle import WrongCodeThrottle

__all__ = [
    "CODE_ALPHABET", "CODE_LENGTH", "SECRET_BYTES", "AccessRefused", "ClassHall", "ClassLimits", "Guess",
    "GuessCount", "LessonScore", "LiveRoom", "Peek", "RoomFull", "RoomStore", "Snapshot", "StoreError", "Tally",
    "WrongCodeThrottle", "guess_as_typed", "lesson_score", "new_code", "new_secret", "normalise_code", "tally",
]
