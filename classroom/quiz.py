"""The Class page's short quiz, asked before and after a lesson: its questions live in an editable
file (assets/class_quiz.json), and the class's answers become a share right per question and
over all, before against after.

A file a teacher edited wrongly is refused with a message that names the question and what is
allowed, and the Class page goes on without a quiz.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

QUIZ_FILE = Path(__file__).resolve().parents[1] / "assets" / "class_quiz.json"
PHASES = ("before", "after")
QUESTIONS = (1, 10)
CHOICES = (2, 6)
MAX_CHARS = 300  # a question's, a choice's or a reason's text


class QuizError(ValueError):
    """The quiz file cannot be read or is not a quiz (the message says where and why)."""


@dataclass(frozen=True)
class Question:
    text: str
    choices: tuple[str, ...]
    answer: int  # the right choice's index
    why: str


@dataclass(frozen=True)
class AnswerRow:
    """One student's answer to one question in one phase."""

    phase: str
    student: str
    question: int
    choice: int


def load_quiz(path: Path = QUIZ_FILE) -> tuple[Question, ...]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise QuizError(f"The quiz file {Path(path).name} cannot be read: {exc}.") from exc
    items = data.get("questions") if isinstance(data, dict) else None
    if not isinstance(items, list) or not QUESTIONS[0] <= len(items) <= QUESTIONS[1]:
        raise QuizError(f"The quiz file needs a list \"questions\" of {QUESTIONS[0]} to {QUESTIONS[1]} questions.")
    return tuple(_question(number, item) for number, item in enumerate(items, start=1))


def _question(number: int, item: object) -> Question:
    where = f"Question {number} of the quiz file"
    if not isinstance(item, dict):
        raise QuizError(f"{where} is not an object with \"question\", \"choices\", \"answer\" and \"why\".")
    text, choices, answer, why = (item.get(k) for k in ("question", "choices", "answer", "why"))
    texts = [text, why, *(choices if isinstance(choices, list) else [])]
    if not all(isinstance(t, str) and t.strip() and len(t) <= MAX_CHARS for t in texts):
        raise QuizError(f"{where}: the question, each choice and \"why\" must be text of 1 to {MAX_CHARS} characters.")
    if not isinstance(choices, list) or not CHOICES[0] <= len(choices) <= CHOICES[1]:
        raise QuizError(f"{where} needs {CHOICES[0]} to {CHOICES[1]} choices.")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise QuizError(f"{where}: \"answer\" must be the right choice's number counted from 0 "
                        f"(0 to {len(choices) - 1}).")
    return Question(text.strip(), tuple(c.strip() for c in choices), answer, why.strip())


@dataclass(frozen=True)
class PhaseResult:
    """One phase's answers: who answered, and the share right per question and over all."""

    phase: str
    students: int
    per_question: tuple[float | None, ...]  # None: no one answered that question
    overall: float | None


def phase_results(questions: Sequence[Question], rows: Sequence[AnswerRow]) -> dict[str, PhaseResult]:
    """Each phase with answers: the share of its answers that were right."""
    results = {}
    for phase in PHASES:
        mine = [row for row in rows if row.phase == phase and 0 <= row.question < len(questions)]
        if not mine:
            continue
        per_question = []
        for index, question in enumerate(questions):
            answers = [row.choice for row in mine if row.question == index]
            per_question.append(sum(c == question.answer for c in answers) / len(answers) if answers else None)
        right = sum(row.choice == questions[row.question].answer for row in mine)
        results[phase] = PhaseResult(phase, len({row.student for row in mine}), tuple(per_question),
                                     right / len(mine))
    return results
