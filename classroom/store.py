"""The rooms' embedded database: SQLite from the standard library, in WAL mode.

One file holds every room: its code, the digest of its presenter secret, when it was made and
last used, its version, and its generation as the engine's trace (settings included); the
students who joined (a display name each, optional); and every guess, keyed by the context it
was a guess for. WAL lets the students' reads go on while the presenter writes.

One connection, shared by the server's threads behind a lock: every statement here is short.
Any SQLite error becomes a StoreError that says what could not be done, so a corrupt or
unreadable file is reported and never crashes a page.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from classroom.quiz import AnswerRow

SCHEMA_VERSION = 3  # 2 added the quiz's tables, 3 the presenter's browsers; an older file gains them when opened
READABLE_VERSIONS = (0, 1, 2, SCHEMA_VERSION)  # 0: a new file
SCHEMA = """
CREATE TABLE IF NOT EXISTS rooms (
    code TEXT PRIMARY KEY,
    secret_digest TEXT NOT NULL,
    created REAL NOT NULL,
    touched REAL NOT NULL,
    version INTEGER NOT NULL,
    trace TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS students (
    code TEXT NOT NULL REFERENCES rooms(code) ON DELETE CASCADE,
    student TEXT NOT NULL,
    name TEXT NOT NULL,
    joined REAL NOT NULL,
    PRIMARY KEY (code, student)
);
CREATE TABLE IF NOT EXISTS guesses (
    code TEXT NOT NULL REFERENCES rooms(code) ON DELETE CASCADE,
    context TEXT NOT NULL,
    student TEXT NOT NULL,
    text TEXT NOT NULL,
    token_id INTEGER NOT NULL,
    made REAL NOT NULL,
    PRIMARY KEY (code, context, student)
);
CREATE TABLE IF NOT EXISTS quiz_phases (
    code TEXT NOT NULL REFERENCES rooms(code) ON DELETE CASCADE,
    phase TEXT NOT NULL,
    opened REAL NOT NULL,
    closed REAL,
    PRIMARY KEY (code, phase)
);
CREATE TABLE IF NOT EXISTS quiz_answers (
    code TEXT NOT NULL REFERENCES rooms(code) ON DELETE CASCADE,
    phase TEXT NOT NULL,
    student TEXT NOT NULL,
    question INTEGER NOT NULL,
    choice INTEGER NOT NULL,
    made REAL NOT NULL,
    PRIMARY KEY (code, phase, student, question)
);
CREATE TABLE IF NOT EXISTS presenter_browsers (
    code TEXT NOT NULL REFERENCES rooms(code) ON DELETE CASCADE,
    browser TEXT NOT NULL,
    trusted REAL NOT NULL,
    PRIMARY KEY (code, browser)
);
"""


class StoreError(RuntimeError):
    """The class database cannot be opened, read or written (the message says which)."""


@dataclass(frozen=True)
class RoomRow:
    """One room as stored."""

    code: str
    secret_digest: str
    created: float
    touched: float
    version: int
    trace: str  # the engine's trace, as JSON


@dataclass(frozen=True)
class GuessRow:
    """One student's guess for one context."""

    context: str
    student: str
    name: str  # the student's display name, "" when none was given
    text: str  # as typed
    token_id: int  # its first token, the one that counts


class RoomStore:
    """The rooms of one server (or of several, sharing the file on one machine)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in READABLE_VERSIONS:
                raise StoreError(f"The class database is of schema version {version}; this app reads "
                                 f"version {SCHEMA_VERSION}.")
            self._db.executescript(SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION};")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"The class database cannot be opened: {exc}.") from exc
        self.journal_mode = mode

    @contextmanager
    def _run(self, doing: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise StoreError(f"The class database could not {doing}: {exc}.") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- rooms -----------------------------------------------------------------------------

    def create(self, code: str, secret_digest: str, trace: str, now: float) -> None:
        with self._run("save a new room") as db:
            db.execute("INSERT INTO rooms VALUES (?, ?, ?, ?, 0, ?)", (code, secret_digest, now, now, trace))

    def room(self, code: str) -> RoomRow | None:
        with self._run("read a room") as db:
            row = db.execute("SELECT code, secret_digest, created, touched, version, trace FROM rooms WHERE code = ?",
                             (code,)).fetchone()
        return RoomRow(*row) if row else None

    def exists(self, code: str) -> bool:
        with self._run("look up a room") as db:
            return db.execute("SELECT 1 FROM rooms WHERE code = ?", (code,)).fetchone() is not None

    def save(self, code: str, trace: str, version: int, now: float) -> int:
        """The room's generation after the presenter changed it, under a stored version above
        every earlier one (at least `version`); returns that version. Another process serving
        the same class reads it to tell that the room moved on (ClassHall.sync)."""
        with self._run("save the room's generation") as db:
            row = db.execute("UPDATE rooms SET trace = ?, version = MAX(version + 1, ?), touched = ? WHERE code = ? "
                             "RETURNING version", (trace, version, now, code)).fetchone()
        return row[0] if row else version

    def bump(self, code: str, now: float) -> int:
        """A change students see that is stored elsewhere (the quiz opened or closed): the
        room's stored version moves on; returns it."""
        with self._run("note the room's change") as db:
            row = db.execute("UPDATE rooms SET version = version + 1, touched = ? WHERE code = ? RETURNING version",
                             (now, code)).fetchone()
        return row[0] if row else 0

    def version(self, code: str) -> int | None:
        """The room's stored version (None: no such room)."""
        with self._run("read the room's version") as db:
            row = db.execute("SELECT version FROM rooms WHERE code = ?", (code,)).fetchone()
        return row[0] if row else None

    def announce(self, code: str) -> None:
        """Tell the other processes serving this database that the room moved on: nothing to do
        for a file (they read its version when their students next check: ClassHall.sync)."""

    def listen(self, on_change: Callable[[str], None]) -> threading.Event:
        """Call `on_change(code)` when another process announces a room: never, for a file. The
        event returned is set while announcements are heard: always, for a file (nothing to hear)."""
        heard = threading.Event()
        heard.set()
        return heard

    def touch(self, code: str, now: float) -> None:
        with self._run("note the room's use") as db:
            db.execute("UPDATE rooms SET touched = ? WHERE code = ?", (now, code))

    def open_count(self) -> int:
        with self._run("count the rooms") as db:
            return db.execute("SELECT COUNT(*) FROM rooms").fetchone()[0]

    def delete_idle(self, before: float) -> list[str]:
        """Delete every room last used before `before`, with its students and guesses."""
        with self._run("remove expired rooms") as db:
            codes = [row[0] for row in db.execute("SELECT code FROM rooms WHERE touched < ?", (before,))]
            db.execute("DELETE FROM rooms WHERE touched < ?", (before,))
        return codes

    # ---- the presenter's browsers ----------------------------------------------------------

    def trust(self, code: str, browser: str, now: float, keep: int) -> None:
        """`browser` showed the room's secret: it opens the room as presenter again, after a
        restart too. Only the `keep` most recent browsers stay trusted."""
        with self._run("note the presenter's browser") as db:
            db.execute("INSERT INTO presenter_browsers VALUES (?, ?, ?) ON CONFLICT (code, browser) DO UPDATE "
                       "SET trusted = excluded.trusted", (code, browser, now))
            db.execute("DELETE FROM presenter_browsers WHERE code = ? AND browser NOT IN (SELECT browser FROM "
                       "presenter_browsers WHERE code = ? ORDER BY trusted DESC, browser LIMIT ?)", (code, code, keep))

    def trusts(self, code: str, browser: str) -> bool:
        with self._run("look up the presenter's browser") as db:
            return db.execute("SELECT 1 FROM presenter_browsers WHERE code = ? AND browser = ?",
                              (code, browser)).fetchone() is not None

    # ---- students and guesses --------------------------------------------------------------

    def join(self, code: str, student: str, name: str | None, now: float) -> str:
        """A student in the room (again: the name is updated, or kept when `name` is None).
        Returns the student's name as stored."""
        with self._run("note a student") as db:
            db.execute("INSERT INTO students VALUES (?, ?, COALESCE(?, ''), ?) ON CONFLICT (code, student) DO UPDATE "
                       "SET name = COALESCE(?, name)", (code, student, name, now, name))
            return db.execute("SELECT name FROM students WHERE code = ? AND student = ?",
                              (code, student)).fetchone()[0]

    def student_count(self, code: str) -> int:
        with self._run("count the students") as db:
            return db.execute("SELECT COUNT(*) FROM students WHERE code = ?", (code,)).fetchone()[0]

    def is_student(self, code: str, student: str) -> bool:
        with self._run("look up a student") as db:
            return db.execute("SELECT 1 FROM students WHERE code = ? AND student = ?",
                              (code, student)).fetchone() is not None

    def guess(self, code: str, context: str, student: str, text: str, token_id: int, now: float) -> None:
        """A student's guess for `context`, replacing their earlier one for it."""
        with self._run("save a guess") as db:
            db.execute("INSERT INTO guesses VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (code, context, student) DO UPDATE "
                       "SET text = excluded.text, token_id = excluded.token_id, made = excluded.made",
                       (code, context, student, text, token_id, now))

    def guesses(self, code: str, contexts: tuple[str, ...] | None = None) -> list[GuessRow]:
        """The room's guesses (for these contexts only, when given), each with the student's name."""
        query = ("SELECT g.context, g.student, COALESCE(s.name, ''), g.text, g.token_id FROM guesses g "
                 "LEFT JOIN students s ON s.code = g.code AND s.student = g.student WHERE g.code = ?")
        params: list[object] = [code]
        if contexts is not None:
            # one statement text for any number of contexts: an IN list of one "?" per context made
            # a statement per lesson length, each kept prepared in the connection's cache (a long
            # lesson grew the server by hundreds of MB: docs/class.md, the soak)
            query += " AND g.context IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(contexts))
        with self._run("read the guesses") as db:
            return [GuessRow(*row) for row in db.execute(query + " ORDER BY g.made", params)]

    # ---- the quiz --------------------------------------------------------------------------

    def open_quiz(self, code: str, phase: str, now: float) -> None:
        """Open `phase` ("before" or "after") for answers (again, if it was closed)."""
        with self._run("open the quiz") as db:
            db.execute("INSERT INTO quiz_phases VALUES (?, ?, ?, NULL) ON CONFLICT (code, phase) DO UPDATE "
                       "SET closed = NULL", (code, phase, now))

    def close_quiz(self, code: str, now: float) -> None:
        with self._run("close the quiz") as db:
            db.execute("UPDATE quiz_phases SET closed = ? WHERE code = ? AND closed IS NULL", (now, code))

    def open_phase(self, code: str) -> str | None:
        """The quiz phase open for answers now, if any."""
        with self._run("read the quiz") as db:
            row = db.execute("SELECT phase FROM quiz_phases WHERE code = ? AND closed IS NULL", (code,)).fetchone()
        return row[0] if row else None

    def answer(self, code: str, phase: str, student: str, answers: dict[int, int], now: float) -> None:
        """A student's answers in `phase`, replacing their earlier ones to the same questions."""
        with self._run("save quiz answers") as db:
            db.executemany("INSERT INTO quiz_answers VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (code, phase, student, "
                           "question) DO UPDATE SET choice = excluded.choice, made = excluded.made",
                           [(code, phase, student, q, c, now) for q, c in answers.items()])

    def quiz_answers(self, code: str) -> list[AnswerRow]:
        with self._run("read quiz answers") as db:
            return [AnswerRow(*row) for row in db.execute(
                "SELECT phase, student, question, choice FROM quiz_answers WHERE code = ? ORDER BY made", (code,))]
