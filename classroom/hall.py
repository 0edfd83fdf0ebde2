"""The live rooms of one server process: the presenter's generation, what students see, guesses.

A room's one Generation is the presenter's (the Class page drives it with the Step page's
controller); after every change the presenter's page hands it to `publish`, which saves its
trace and, when what a student sees changed, makes a new `Snapshot` with the next version.
Students only read snapshots (plain, frozen records), so a follower never touches the model and
never waits for the presenter. A room missing from memory (the server restarted) is rebuilt
from its stored trace with the engine's exact replay, once, however many students ask at once.

Before each reveal the room can `peek`: the next step is taken and rewound (the KV cache
cropped, the random generator restored, so the Step that follows makes the same token), which
gives the presenter the model's distribution to set beside the class's guesses, and the
students the candidates to pick from, in alphabetical order so their order gives nothing away.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from classroom.codes import new_code, new_secret, normalise_code, secret_digest, secret_matches
from classroom.quiz import PHASES, PhaseResult, Question, phase_results
from classroom.store import GuessRow, RoomStore, StoreError
from classroom.tally import (
    BoardRow,
    Guess,
    LessonScore,
    OwnScore,
    Tally,
    board,
    guess_as_typed,
    lesson_score,
    own_scores,
    tally,
)
from engine import (
    Candidate,
    Distribution,
    Generation,
    GenerationFinished,
    Limits,
    LoadedModel,
    PassQueue,
    SettingsError,
    StepRecord,
    TokenPiece,
    TraceError,
    TraceText,
    catch_up,
    replay,
)

LOG = logging.getLogger(__name__)
SYNC_EVERY_S = 0.5  # how often a room's stored version is read, at most, for another process's changes
PRESENCE_S = 5.0  # a student seen this recently is connected (a follower's page checks every 3 s)
EXPIRE_EVERY_S = 60.0  # how often idle rooms are looked for
CANDIDATES = 6  # candidate chips a student may pick from
PRESENTER_BROWSERS = 4  # browsers per room that reopen it as presenter (a laptop, a tablet, a spare)
REFUSED = ("No open room has that code, or the link is not (or no longer) valid. Check the code on the "
           "projector, or ask for a new link.")


class AccessRefused(Exception):
    """A wrong or expired code or secret: one message for all, so it tells nothing of which rooms exist."""

    def __init__(self) -> None:
        super().__init__(REFUSED)


class RoomFull(Exception):
    """A cap was reached (rooms, students, a guess's or a name's length); the message names it."""


@dataclass(frozen=True)
class ClassLimits:
    """What rooms may cost one server. Checked when a room, a student or a guess arrives."""

    max_rooms: int = 50  # open rooms at once
    max_students: int = 100  # students who have joined one room
    max_guess_chars: int = 40
    max_name_chars: int = 40
    idle_hours: float = 12.0  # a room nobody used for this long is deleted

    def __post_init__(self) -> None:
        for name in ("max_rooms", "max_students", "max_guess_chars", "max_name_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SettingsError(name, value, "a whole number >= 1")
        if not isinstance(self.idle_hours, int | float) or not 0 < self.idle_hours < float("inf"):
            raise SettingsError("idle_hours", self.idle_hours, "a number of hours > 0")


@dataclass(frozen=True)
class Reveal:
    """The latest step as the class sees it once revealed: the pick and how the guesses did."""

    index: int
    pick: TokenPiece
    pick_prob: float
    tally: Tally  # with the model's probability for every guess


@dataclass(frozen=True)
class Snapshot:
    """What every student sees at one version of a room."""

    code: str
    version: int
    steps: tuple[StepRecord, ...]
    prompt_pieces: tuple[TokenPiece, ...]
    prompt_text: str
    output_text: str
    stop_sequences: tuple[str, ...]
    finish_reason: str | None
    eos_text: str  # the model's end token(s), as text
    context: str  # the key the next token's guesses are stored under
    context_text: str  # the text so far, which a typed guess continues
    lesson: LessonScore  # the class against the model over the revealed steps
    candidates: tuple[Candidate, ...] = ()  # to pick from, alphabetical; () until the room has peeked
    reveal: Reveal | None = None
    board: tuple[BoardRow, ...] = ()  # every revealed step: the token, its probability, how many named it
    # each student's own score, read by that student's page only (a view never draws another's)
    scores: dict[str, OwnScore] = field(default_factory=dict)
    quiz_open: str | None = None  # the quiz phase ("before", "after") open for answers, if any

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class Peek:
    """The next step, taken and rewound: the model's distribution before the reveal."""

    context: str
    distribution: Distribution
    probs: torch.Tensor  # [vocab], the raw softmax


@dataclass(eq=False)
class LiveRoom:
    """One open room in this process."""

    code: str
    secret_digest: str
    generation: Generation
    snapshot: Snapshot
    stored: tuple  # what the stored trace was made from (`_signature`)
    lock: threading.RLock = field(default_factory=threading.RLock)
    peek: Peek | None = None
    guesses_version: int = 0  # grows with each guess: the presenter's class panel redraws
    changed_at: float = field(default_factory=time.monotonic)  # when students last got a new step to see
    seen: dict[str, float] = field(default_factory=dict)  # student -> last time seen
    # browser -> the secret it showed: a reload or a second tab of that browser opens the room as
    # presenter again, with its presenter link. The store keeps the browsers, not the secret: after
    # a restart the browser is the presenter still, but its link cannot be shown again.
    presenter_browsers: dict[str, str] = field(default_factory=dict)
    stored_version: int = 0  # the store's version this process last wrote or caught up with
    checked_at: float = float("-inf")  # when this process last read the store's version (monotonic)
    trace_text: TraceText = field(default_factory=TraceText)  # the stored trace, its steps encoded once each

    @property
    def version(self) -> int:
        return self.snapshot.version


def context_key(token_ids: list[int]) -> str:
    """The key guesses for the token after `token_ids` (prompt and output) are stored under."""
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:32]


def step_contexts(generation: Generation) -> list[str]:
    """The key each step's guesses are stored under: the context that step continued."""
    ids = [*generation.prompt_ids, *generation.generated_ids]
    return [context_key(ids[:len(generation.prompt_ids) + i]) for i in range(len(generation.steps))]


def _visible(generation: Generation) -> tuple:
    """What a student sees of a generation (a change makes a new snapshot)."""
    return (id(generation), tuple(generation.prompt_ids), tuple(generation.generated_ids),
            tuple(step.decision.forced for step in generation.steps), generation.finish_reason, generation.stop)


def _signature(generation: Generation) -> tuple:
    """What its stored trace holds (the sampler too, which a student does not see)."""
    return (*_visible(generation), generation.sampler)


class ClassHall:
    """Every room of one server: made, opened with a code (students) or a secret (presenter),
    published, peeked, joined and guessed in. `clock` is time.time (a test moves its own)."""

    def __init__(self, store: RoomStore, lm: LoadedModel, limits: ClassLimits | None = None,
                 replay_limits: Limits | None = None, scheduler: PassQueue | None = None,
                 clock: Callable[[], float] = time.time, quiz: tuple[Question, ...] = ()) -> None:
        self.store, self.lm, self.limits, self.quiz = store, lm, limits or ClassLimits(), quiz
        self.replay_limits, self.scheduler, self.clock = replay_limits or Limits(), scheduler, clock
        self._rooms: dict[str, LiveRoom] = {}
        self._opening: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._expired_at = float("-inf")
        self._listeners: list[Callable[[str], None]] = []  # told each room code whose version moved on

    # ---- rooms -----------------------------------------------------------------------------

    def start(self, generation: Generation) -> tuple[LiveRoom, str]:
        """A new room on `generation`; returns it and its presenter secret (shown once, kept
        by the store only as a digest). Raises RoomFull at the cap on open rooms."""
        self.expire(force=True)
        if (count := self.store.open_count()) >= self.limits.max_rooms:
            raise RoomFull(f"This server already has {count} open rooms, its limit ({self.limits.max_rooms}). "
                           f"A room closes after {self.limits.idle_hours:g} hours unused.")
        code, secret = new_code(self.store.exists), new_secret()
        digest = secret_digest(secret)
        trace_text = TraceText()
        self.store.create(code, digest, trace_text.of(generation), self.clock())
        room = LiveRoom(code, digest, generation, self._snapshot(code, generation, 0), _signature(generation),
                        trace_text=trace_text)
        with self._lock:
            self._rooms[code] = room
        return room, secret

    def trust_browser(self, room: LiveRoom, browser: str, secret: str) -> None:
        """`browser` showed the room's secret (checked by the caller): remember it, so that its
        reloads and other tabs open the room as presenter. Only a browser known by its own cookie
        counts (an address can be shared by a whole class); the most recent few are kept."""
        if not browser.startswith("cookie:"):
            return
        with room.lock:
            room.presenter_browsers.pop(browser, None)
            room.presenter_browsers[browser] = secret
            while len(room.presenter_browsers) > PRESENTER_BROWSERS:
                room.presenter_browsers.pop(next(iter(room.presenter_browsers)))
        try:
            self.store.trust(room.code, browser, self.clock(), PRESENTER_BROWSERS)
        except StoreError as exc:  # the secret still works: only a reload after a restart needs the link
            LOG.warning("Room %s's presenter browser was not stored: %s", room.code, exc)

    def trusted_secret(self, code_text: str, browser: str) -> str | None:
        """The secret `browser` showed for this room before, if it did (see trust_browser)."""
        code = normalise_code(code_text or "")
        with self._lock:
            room = self._rooms.get(code) if code is not None else None
        return room.presenter_browsers.get(browser) if room is not None else None

    def trusted_presenter(self, code_text: str, browser: str) -> LiveRoom | None:
        """The room, when `browser` showed its secret before (to this process or, stored, to one
        before a restart); None otherwise, or when there is no such room."""
        if not browser.startswith("cookie:"):
            return None
        try:
            room = self.room(code_text)
        except AccessRefused:
            return None
        return room if self.store.trusts(room.code, browser) else None

    def room(self, code_text: str) -> LiveRoom:
        """The open room with this code (typed as a student may type it). Raises AccessRefused."""
        code = normalise_code(code_text or "")
        if code is None:
            raise AccessRefused
        self.expire()
        with self._lock:
            room = self._rooms.get(code)
        if room is not None:
            self.sync(room)
            return room
        with self._lock:
            opening = self._opening.setdefault(code, threading.Lock())
        with opening:  # one replay, however many students reconnect at once
            with self._lock:
                if (room := self._rooms.get(code)) is not None:
                    return room
            room = self._rebuilt(code)
            with self._lock:
                self._rooms[code] = room
                self._opening.pop(code, None)
            return room

    def presenter(self, code_text: str, secret: str) -> LiveRoom:
        """The room, for the one who holds its secret. Raises AccessRefused (the same as for a
        code that does not exist)."""
        room = self.room(code_text)
        if not isinstance(secret, str) or not secret_matches(room.secret_digest, secret):
            raise AccessRefused
        return room

    def _rebuilt(self, code: str) -> LiveRoom:
        """A stored room made live again: its generation replayed exactly from its trace."""
        row = self.store.room(code)
        if row is None:
            raise AccessRefused
        try:
            generation = replay(self.lm, json.loads(row.trace), self.replay_limits, scheduler=self.scheduler).generation
        except (TraceError, ValueError) as exc:
            raise TraceError(f"Room {code}'s generation could not be rebuilt from its stored trace: {exc}") from exc
        return LiveRoom(code, row.secret_digest, generation, self._snapshot(code, generation, row.version),
                        _signature(generation), stored_version=row.version, checked_at=time.monotonic())

    # ---- several processes, one class ------------------------------------------------------

    def sync(self, room: LiveRoom, force: bool = False) -> bool:
        """Take another process's changes to the room (a class served by several app processes
        sharing one database): when the store holds a later version than this process wrote or
        read, the room's generation catches up with the stored trace (only the new steps are
        taken, as a replay takes them: the same tokens), the snapshot is made again (guesses and
        the quiz read afresh) and the room peeks for its students' candidates. The store's
        version is read at most every SYNC_EVERY_S per room unless `force` (an announcement).
        Returns whether the room moved on."""
        now = time.monotonic()
        if not force and now - room.checked_at < SYNC_EVERY_S:
            return False
        room.checked_at = now
        stored = self.store.version(room.code)
        if stored is None or stored <= room.stored_version:
            return False
        with room.lock:
            row = self.store.room(room.code)
            if row is None or row.version <= room.stored_version:
                return False
            trace = json.loads(row.trace)
            if not catch_up(room.generation, trace, self.replay_limits):
                room.generation.close()
                room.generation = replay(self.lm, trace, self.replay_limits, scheduler=self.scheduler).generation
            room.stored, room.stored_version = _signature(room.generation), row.version
            room.peek, room.changed_at = None, time.monotonic()
            room.snapshot = self._snapshot(room.code, room.generation, room.version + 1)
            self._announce(room)
        self.peek_later(room)
        return True

    def watch(self) -> threading.Event:
        """Follow the other processes' announcements (PostgreSQL's NOTIFY; nothing for a file):
        a room this process holds catches up the moment another moves it on. Returns the store's
        event, set while announcements are heard."""
        return self.store.listen(self._announced)

    def _announced(self, code: str) -> None:
        with self._lock:
            room = self._rooms.get(code)
        if room is not None:
            with contextlib.suppress(TraceError, StoreError):  # its students' next check tries again
                self.sync(room, force=True)

    def expire(self, force: bool = False) -> list[str]:
        """Delete rooms unused for the idle time (looked for at most once a minute)."""
        now = self.clock()
        if not force and now - self._expired_at < EXPIRE_EVERY_S:
            return []
        self._expired_at = now
        codes = self.store.delete_idle(now - self.limits.idle_hours * 3600)
        with self._lock:
            for code in codes:
                if (room := self._rooms.pop(code, None)) is not None:
                    room.generation.close()
        return codes

    def version(self, code: str) -> int | None:
        """The version of the open room with exactly this code, if this process holds it (a room
        not rebuilt yet after a restart reads as None, as a wrong code does)."""
        with self._lock:
            room = self._rooms.get(code)
        return None if room is None else room.version

    def snapshot(self, code: str) -> Snapshot | None:
        """What every student sees of the open room with exactly this code, if this process holds it."""
        with self._lock:
            room = self._rooms.get(code)
        return None if room is None else room.snapshot

    def on_version(self, listener: Callable[[str], None]) -> None:
        """Call `listener(code)` after every new version of a room (from the thread that made it,
        holding the room's lock: it must not block). The follow endpoint wakes students with it."""
        self._listeners.append(listener)

    def _announce(self, room: LiveRoom) -> None:
        for listener in self._listeners:
            listener(room.code)

    # ---- the presenter's changes -----------------------------------------------------------

    def publish(self, room: LiveRoom, generation: Generation) -> bool:
        """Make `generation` the room's (the presenter's page calls this after each action):
        its trace is saved when it changed, and a new snapshot is made when what students see
        changed. Returns whether it did."""
        with room.lock:
            signature = _signature(generation)
            if generation is room.generation and signature == room.stored:
                return False
            visible_changed = _visible(generation) != room.stored[:-1]  # the stored signature ends with the sampler
            room.generation, room.stored = generation, signature
            version = room.version + 1
            room.stored_version = self.store.save(room.code, room.trace_text.of(generation), version, self.clock())
            self.store.announce(room.code)
            if visible_changed:
                room.peek, room.changed_at = None, time.monotonic()
                room.snapshot = self._snapshot(room.code, generation, version)
            else:
                room.snapshot = replace(room.snapshot, version=version)
            self._announce(room)
        return True

    def peek(self, room: LiveRoom) -> Peek | None:
        """The model's distribution for the next token, before the reveal (taken once per
        context: the step is made and rewound). None when the generation cannot step."""
        with room.lock:
            return self._peek(room)

    def peek_later(self, room: LiveRoom) -> None:
        """Peek on a thread of its own: the presenter's page asks once its run has drawn the
        reveal, so the presenter never waits for the peek's forward pass (their next action
        waits for the room's lock if the peek is still running)."""
        if room.peek is None or room.peek.context != room.snapshot.context:
            threading.Thread(target=self.peek, args=(room,), name="class-peek", daemon=True).start()

    def _peek(self, room: LiveRoom) -> Peek | None:
        generation, snapshot = room.generation, room.snapshot
        if room.peek is not None and room.peek.context == snapshot.context:
            return room.peek
        if generation.finished or generation.closed:
            return None
        try:
            record = generation.step()
        except (GenerationFinished, SettingsError):
            return None
        except RuntimeError:  # the server's scheduler has shut down under a peek on its own thread
            return None
        probs = torch.softmax(generation.raw_logits(), dim=-1)  # [vocab]
        generation.rewind(len(generation.steps) - 1)
        room.peek = Peek(snapshot.context, record.distribution, probs)
        candidates = sorted(record.distribution.top[:CANDIDATES], key=lambda c: (c.text.strip().lower(), c.text))
        room.snapshot = replace(snapshot, version=snapshot.version + 1, candidates=tuple(candidates))
        self._announce(room)
        return room.peek

    # ---- students --------------------------------------------------------------------------

    def join(self, room: LiveRoom, student: str, name: str | None) -> str:
        """Note a student and their display name (which may be empty; None keeps the one they
        gave before, as a reload does). Returns the name now stored. Raises RoomFull."""
        name = None if name is None else name.strip()
        if name is not None and len(name) > self.limits.max_name_chars:
            raise RoomFull(f"A name may have up to {self.limits.max_name_chars} characters; this one has {len(name)}.")
        if not self.store.is_student(room.code, student) and (
                count := self.store.student_count(room.code)) >= self.limits.max_students:
            raise RoomFull(f"This room already has {count} students, its limit ({self.limits.max_students}).")
        stored = self.store.join(room.code, student, name, self.clock())
        self.seen(room, student)
        return stored

    def guess_of(self, room: LiveRoom, student: str) -> str | None:
        """The token this student guessed for the room's next token, as its text (the guess's first
        token, the one that counts), if any: a reloaded page shows it again."""
        rows = self.store.guesses(room.code, (room.snapshot.context,))
        token = next((row.token_id for row in reversed(rows) if row.student == student), None)
        return None if token is None else self.lm.texts.piece(token).text

    def seen(self, room: LiveRoom, student: str) -> None:
        room.seen[student] = time.monotonic()

    def connected(self, room: LiveRoom) -> int:
        """Students whose page checked the room in the last PRESENCE_S seconds."""
        now = time.monotonic()
        for student, last in list(room.seen.items()):
            if now - last > PRESENCE_S * 12:
                room.seen.pop(student, None)
        return sum(now - last <= PRESENCE_S for last in list(room.seen.values()))

    def guess(self, room: LiveRoom, student: str, text: str | None = None, token_id: int | None = None,
              context: str | None = None) -> TokenPiece | None:
        """A student's guess for the next token: typed `text` (its first token counts) or a
        candidate's `token_id`. It replaces their earlier guess for this step. Returns the
        token that counts, or None, storing nothing, when `context` (the context the student's
        controls were drawn for) is no longer the room's: a browser sends every input's value
        with each rerun, so a field the reveal replaced reaches the server again as a change if
        the page reruns before it has drawn the new one, and must not become a guess for the
        next token. Raises RoomFull for a guess too
        long, ValueError for one that cannot be a guess now (the message says why)."""
        snapshot = room.snapshot
        if context is not None and context != snapshot.context:
            return None
        if snapshot.finished:
            raise ValueError("The generation has finished: there is no next token to guess.")
        if not self.store.is_student(room.code, student):
            raise ValueError("Join the room first.")
        if token_id is not None:
            if token_id not in {c.token_id for c in snapshot.candidates}:
                raise ValueError("That candidate is not one of this step's.")
            shown = self.lm.texts.piece(token_id).text
        else:
            shown = (text or "").strip()
            if not shown:
                raise ValueError("Type a word or a few characters, or pick a candidate.")
            if len(shown) > self.limits.max_guess_chars:
                raise RoomFull(f"A guess may have up to {self.limits.max_guess_chars} characters; "
                               f"this one has {len(shown)}.")
            ids = self.lm.tokenizer.encode(guess_as_typed(shown, snapshot.context_text), add_special_tokens=False)
            if not ids:
                raise ValueError("That guess has no token.")
            token_id = ids[0]
        self.store.guess(room.code, snapshot.context, student, shown, token_id, self.clock())
        with room.lock:
            room.guesses_version += 1
        return self.lm.texts.piece(token_id)

    # ---- the quiz -------------------------------------------------------------------------------

    def open_quiz(self, room: LiveRoom, phase: str) -> None:
        """Open the quiz's `phase` ("before" or "after") on every student's screen (closing any
        other). Raises ValueError when this server has no quiz or the phase is not one."""
        if not self.quiz:
            raise ValueError("This server has no quiz: its quiz file is missing or could not be read.")
        if phase not in PHASES:
            raise ValueError(f"A quiz phase is one of {', '.join(PHASES)}.")
        with room.lock:
            self.store.close_quiz(room.code, self.clock())
            self.store.open_quiz(room.code, phase, self.clock())
            self._stored_change(room, quiz_open=phase)

    def close_quiz(self, room: LiveRoom) -> None:
        with room.lock:
            self.store.close_quiz(room.code, self.clock())
            self._stored_change(room, quiz_open=None)

    def _stored_change(self, room: LiveRoom, **changes: object) -> None:
        """A change students see, already in the store: a new version here and in the store, and
        every listener told (this process's followers, and the other processes'). Holding the lock."""
        room.stored_version = self.store.bump(room.code, self.clock())
        room.snapshot = replace(room.snapshot, version=room.snapshot.version + 1, **changes)
        self.store.announce(room.code)
        self._announce(room)

    def answer_quiz(self, room: LiveRoom, student: str, answers: dict[int, int]) -> None:
        """A student's answers to the open phase (question index -> choice index), replacing
        their earlier ones. Raises ValueError when no phase is open or an answer is not a choice."""
        phase = room.snapshot.quiz_open
        if phase is None:
            raise ValueError("The quiz is closed: the presenter opens it before and after the lesson.")
        if not self.store.is_student(room.code, student):
            raise ValueError("Join the room first.")
        if not answers:
            raise ValueError("Choose an answer to at least one question.")
        for question, choice in answers.items():
            if not (0 <= question < len(self.quiz) and 0 <= choice < len(self.quiz[question].choices)):
                raise ValueError("That answer is not one of the quiz's choices.")
        self.store.answer(room.code, phase, student, dict(answers), self.clock())

    def own_answers(self, room: LiveRoom, student: str) -> dict[int, int]:
        """This student's answers to the open phase, by question (a reloaded page shows them again)."""
        phase = room.snapshot.quiz_open
        return {row.question: row.choice for row in self.store.quiz_answers(room.code)
                if row.phase == phase and row.student == student}

    def quiz_answered(self, room: LiveRoom) -> int:
        """Students who have answered the open phase."""
        phase = room.snapshot.quiz_open
        return len({row.student for row in self.store.quiz_answers(room.code) if row.phase == phase})

    def quiz_phases(self, room: LiveRoom) -> dict[str, PhaseResult]:
        """Each phase the class answered: its share right per question and over all."""
        return phase_results(self.quiz, self.store.quiz_answers(room.code)) if self.quiz else {}

    def quiz_results(self, room: LiveRoom) -> dict | None:
        """The quiz's questions and each phase's results as plain data, or None before any answer."""
        phases = self.quiz_phases(room)
        if not phases:
            return None
        return {"questions": [{"question": q.text, "right_answer": q.choices[q.answer]} for q in self.quiz],
                "phases": {name: {"students": r.students, "overall": r.overall, "per_question": list(r.per_question)}
                           for name, r in phases.items()}}

    def own_guess(self, room: LiveRoom, student: str) -> str | None:
        """The student's guess for the next token (the token's text), or None."""
        rows = self.store.guesses(room.code, (room.snapshot.context,))
        mine = [row for row in rows if row.student == student]
        return self.lm.texts.piece(mine[-1].token_id).text if mine else None

    def class_tally(self, room: LiveRoom) -> Tally:
        """The presenter's view of the next token's guesses, with the model's probability for
        each (from the peek, when there is one)."""
        peek = room.peek if room.peek is not None and room.peek.context == room.snapshot.context else None
        rows = self.store.guesses(room.code, (room.snapshot.context,))
        return tally(_guesses(rows), self._text, None if peek is None else (lambda t: float(peek.probs[t])))

    def _text(self, token_id: int) -> str:
        return self.lm.texts.piece(token_id).text

    # ---- the snapshot ----------------------------------------------------------------------

    def step_guesses(self, code: str, generation: Generation) -> list[list[GuessRow]]:
        """Each step's guesses, as stored (made for the context before it), oldest first."""
        contexts = step_contexts(generation)
        grouped: dict[str, list[GuessRow]] = {context: [] for context in contexts}
        for row in self.store.guesses(code, tuple(contexts)) if contexts else []:
            grouped[row.context].append(row)
        return [grouped[context] for context in contexts]

    def _snapshot(self, code: str, generation: Generation, version: int) -> Snapshot:
        steps = generation.steps
        per_step = [_guesses(rows) for rows in self.step_guesses(code, generation)]
        rows_on_board = board([(s.token_id, s.token.text, s.prob) for s in steps], per_step)
        reveal = None
        if steps:
            latest = steps[-1]
            probs = self._latest_probs(generation)
            reveal = Reveal(latest.index, latest.token, latest.prob,
                            tally(per_step[-1], self._text, None if probs is None else (lambda t: float(probs[t]))))
        return Snapshot(
            code=code, version=version, steps=steps, prompt_pieces=tuple(generation.prompt_pieces),
            prompt_text=generation.prompt_text, output_text=generation.output_text,
            stop_sequences=generation.stop.stop_sequences, finish_reason=generation.finish_reason,
            eos_text=" ".join(self._text(i) for i in self.lm.eos_ids),
            context=context_key([*generation.prompt_ids, *generation.generated_ids]),
            context_text=generation.prompt_text + generation.output_text, reveal=reveal,
            lesson=lesson_score(rows_on_board), board=rows_on_board,
            scores=own_scores([s.token_id for s in steps], per_step), quiz_open=self.store.open_phase(code))

    @staticmethod
    def _latest_probs(generation: Generation) -> torch.Tensor | None:
        """The latest step's raw softmax `[vocab]`, for every guess's probability."""
        if generation.closed:
            return None
        return torch.softmax(generation.raw_logits(), dim=-1)


def _guesses(rows: list[GuessRow]) -> list[Guess]:
    return [Guess(row.student, row.name, row.text, row.token_id) for row in rows]
