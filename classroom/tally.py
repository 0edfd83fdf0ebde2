"""The class's guesses for one next token, their tally, and the lesson's score.

A guess is a word or a few characters; the token that counts is its first one, read as the
model would continue the context: a guess that starts with a letter or digit after text that
does not end in a space is a new word, so it gets the leading space the model's word tokens
carry (" Paris"). Pick a candidate chip for anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


def guess_as_typed(guess: str, context_text: str) -> str:
    """The text whose first token is the guess: trimmed, and a new word after a word."""
    text = guess.strip()
    if text and text[0].isalnum() and context_text and not context_text[-1].isspace():
        return " " + text
    return text


@dataclass(frozen=True)
class Guess:
    """One student's guess, as the tally reads it."""

    student: str
    name: str  # "" when the student gave none
    text: str  # as typed
    token_id: int


@dataclass(frozen=True)
class GuessCount:
    """One token the class guessed: how many, who, and the model's probability for it."""

    token_id: int
    text: str  # the token's text
    count: int
    names: tuple[str, ...]  # the display names of those who gave one
    model_prob: float | None  # the model's raw softmax probability; None while hidden


@dataclass(frozen=True)
class Tally:
    """The class's guesses for one step, the most guessed first."""

    counts: tuple[GuessCount, ...]
    total: int

    def right(self, token_id: int) -> int:
        """How many guessed `token_id`."""
        return next((c.count for c in self.counts if c.token_id == token_id), 0)


def tally(guesses: Sequence[Guess], token_text: Callable[[int], str],
          model_prob: Callable[[int], float] | None = None) -> Tally:
    """Count the guesses by token; `model_prob` (token id -> probability) where it may be shown."""
    by_token: dict[int, list[Guess]] = {}
    for guess in guesses:
        by_token.setdefault(guess.token_id, []).append(guess)
    counts = [GuessCount(token_id, token_text(token_id), len(group), tuple(g.name for g in group if g.name),
                         model_prob(token_id) if model_prob else None)
              for token_id, group in by_token.items()]
    counts.sort(key=lambda c: (-c.count, -(c.model_prob or 0.0), c.token_id))
    return Tally(tuple(counts), len(guesses))


# ---- the lesson's board, each student's own score, the summary --------------------------------

HUMAN_TOP1 = 0.29  # people's share of next tokens named right, top-1
HUMAN_SOURCE = ("Shlegeris et al., “Language Models Are Better Than Humans at Next-token Prediction”, TMLR 2024: "
                "people named the next token about 29 % of the time, fewer than a ~125 M-parameter model")
EXTREMES = 3  # the hardest and the easiest tokens a summary names


@dataclass(frozen=True)
class BoardRow:
    """One revealed step on the lesson's board: the token the model wrote, its probability, and
    how the class did (counts only: never who)."""

    index: int  # the step's number, from 1
    text: str  # the token the model wrote
    model_prob: float  # the model's raw probability for it
    guesses: int
    right: int

    @property
    def share_right(self) -> float | None:
        return self.right / self.guesses if self.guesses else None


def board(steps: Sequence[tuple[int, str, float]], guesses: Sequence[Sequence[Guess]]) -> tuple[BoardRow, ...]:
    """`steps`: each revealed step's (pick, its text, its raw probability); `guesses`: each step's."""
    return tuple(BoardRow(i + 1, text, prob, len(group), sum(g.token_id == pick for g in group))
                 for i, ((pick, text, prob), group) in enumerate(zip(steps, guesses, strict=True)))


@dataclass(frozen=True)
class LessonScore:
    """Over the steps the class guessed: the class's top-1 accuracy against the model's average
    probability for the tokens it actually produced."""

    steps: int  # steps with at least one guess
    guesses: int
    right: int
    model_mean_prob: float  # mean raw probability of each of those steps' pick

    @property
    def class_accuracy(self) -> float:
        return self.right / self.guesses if self.guesses else 0.0


def lesson_score(rows: Sequence[BoardRow]) -> LessonScore:
    """The lesson's score, from its board: over the steps with at least one guess."""
    guessed = [row for row in rows if row.guesses]
    mean = sum(row.model_prob for row in guessed) / len(guessed) if guessed else 0.0
    return LessonScore(len(guessed), sum(row.guesses for row in guessed), sum(row.right for row in guessed), mean)


@dataclass(frozen=True)
class OwnScore:
    """One student's own record over the revealed steps."""

    right: int
    guessed: int


def own_scores(picks: Sequence[int], guesses: Sequence[Sequence[Guess]]) -> dict[str, OwnScore]:
    """Each student who guessed: how many of their guesses named the token the model wrote."""
    right: dict[str, int] = {}
    guessed: dict[str, int] = {}
    for pick, group in zip(picks, guesses, strict=True):
        for guess in group:
            guessed[guess.student] = guessed.get(guess.student, 0) + 1
            right[guess.student] = right.get(guess.student, 0) + (guess.token_id == pick)
    return {student: OwnScore(right[student], count) for student, count in guessed.items()}


@dataclass(frozen=True)
class LessonSummary:
    """The end of a lesson: what was generated and guessed, the class's and the model's scores,
    and the steps the class found hardest and easiest."""

    tokens: int
    students: int  # who guessed at least once
    score: LessonScore
    hardest: tuple[BoardRow, ...]  # the lowest share named right first (then the least probable)
    easiest: tuple[BoardRow, ...]  # the highest share first (then the most probable)


def lesson_summary(rows: Sequence[BoardRow], students: int) -> LessonSummary:
    guessed = [row for row in rows if row.guesses]
    hardest = sorted(guessed, key=lambda r: (r.share_right, r.model_prob, r.index))[:EXTREMES]
    easiest = sorted(guessed, key=lambda r: (-r.share_right, -r.model_prob, r.index))[:EXTREMES]
    return LessonSummary(len(rows), students, lesson_score(rows), tuple(hardest), tuple(easiest))
