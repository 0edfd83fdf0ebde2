"""The rooms in PostgreSQL, for several app processes serving one class (TBT_ROOMS_URL).

The same tables and the same methods as the SQLite store (classroom/store.py), so the hall and
every page work on either: each process's hall reads and writes rooms, students, guesses and the
quiz here, and any process can open any room (its generation rebuilt from the stored trace). One
connection per process behind a lock, in autocommit: every statement is short and stands alone.
A connection the server dropped (a restart of PostgreSQL) is made again once before a statement
is given up; any database error becomes a StoreError that says what could not be done, without
the URL (it may hold a password).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from classroom.quiz import AnswerRow
from classroom.store import READABLE_VERSIONS, SCHEMA, SCHEMA_VERSION, GuessRow, RoomRow, StoreError

# SQLite's schema, in PostgreSQL's types
PG_SCHEMA = re.sub(r"\bREAL\b", "DOUBLE PRECISION", SCHEMA) + """
CREATE TABLE IF NOT EXISTS tbt_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
CONNECT_TIMEOUT_S = 5
CHANNEL = "tbt_rooms"  # NOTIFY's channel: a room's code when it moved on
RELISTEN_S = 1.0


class PostgresRoomStore:
    """The rooms of every process that names the same database."""

    def __init__(self, url: str) -> None:
        import psycopg  # only a server that names a database needs the driver

        self._psycopg = psycopg
        self._url = url
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._db = self._connect()
            with self._db.transaction():
                self._db.execute("SELECT pg_advisory_xact_lock(7411)")  # two processes starting together
                self._db.execute(PG_SCHEMA)
                row = self._db.execute("SELECT value FROM tbt_meta WHERE key = 'schema'").fetchone()
                if row is not None and row[0] not in READABLE_VERSIONS:
                    raise StoreError(f"The class database is of schema version {row[0]}; this app reads "
                                     f"version {SCHEMA_VERSION}.")
                self._db.execute("INSERT INTO tbt_meta VALUES ('schema', %s) ON CONFLICT (key) DO UPDATE "
                                 "SET value = excluded.value", (SCHEMA_VERSION,))
        except psycopg.Error as exc:
            raise StoreError(f"The class database cannot be opened: {_said(exc)}.") from exc

    def _connect(self):
        return self._psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)

    @contextmanager
    def _run(self, doing: str) -> Iterator:
        with self._lock:
            try:
                if self._db.closed or self._db.broken:
                    self._db = self._connect()
                yield self._db
            except self._psycopg.OperationalError as exc:
                self._db.close()  # made again by the next statement
                raise StoreError(f"The class database could not {doing}: {_said(exc)}.") from exc
            except self._psycopg.Error as exc:
                raise StoreError(f"The class database could not {doing}: {_said(exc)}.") from exc

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._db.close()

    # ---- rooms -----------------------------------------------------------------------------

    def create(self, code: str, secret_digest: str, trace: str, now: float) -> None:
        with self._run("save a new room") as db:
            db.execute("INSERT INTO rooms VALUES (%s, %s, %s, %s, 0, %s)", (code, secret_digest, now, now, trace))

    def room(self, code: str) -> RoomRow | None:
        with self._run("read a room") as db:
            row = db.execute("SELECT code, secret_digest, created, touched, version, trace FROM rooms WHERE code = %s",
                             (code,)).fetchone()
        return RoomRow(*row) if row else None

    def exists(self, code: str) -> bool:
        with self._run("look up a room") as db:
            return db.execute("SELECT 1 FROM rooms WHERE code = %s", (code,)).fetchone() is not None

    def save(self, code: str, trace: str, version: int, now: float) -> int:
        with self._run("save the room's generation") as db:
            row = db.execute("UPDATE rooms SET trace = %s, version = GREATEST(version + 1, %s), touched = %s "
                             "WHERE code = %s RETURNING version", (trace, version, now, code)).fetchone()
        return row[0] if row else version

    def bump(self, code: str, now: float) -> int:
        with self._run("note the room's change") as db:
            row = db.execute("UPDATE rooms SET version = version + 1, touched = %s WHERE code = %s RETURNING version",
                             (now, code)).fetchone()
        return row[0] if row else 0

    def version(self, code: str) -> int | None:
        with self._run("read the room's version") as db:
            row = db.execute("SELECT version FROM rooms WHERE code = %s", (code,)).fetchone()
        return row[0] if row else None

    def announce(self, code: str) -> None:
        """Wake every process listening (`listen`): the room moved on."""
        with self._run("announce the room's change") as db:
            db.execute("SELECT pg_notify(%s, %s)", (CHANNEL, code))

    def listen(self, on_change: Callable[[str], None]) -> threading.Event:
        """Call `on_change(code)` on a thread of its own for every room another process (or this
        one) announces, on a connection of its own; a dropped connection is made again after
        RELISTEN_S, and a room announced meanwhile is found by its students' next check. The
        event returned is set while the connection listens: an announcement made before it is
        set is not heard."""
        heard = threading.Event()
        threading.Thread(target=self._listen, args=(on_change, heard), name="class-rooms-listen",
                         daemon=True).start()
        return heard

    def _listen(self, on_change: Callable[[str], None], heard: threading.Event) -> None:
        while not self._closed:
            try:
                with self._psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as db:
                    db.execute(f"LISTEN {CHANNEL}")
                    heard.set()
                    while not self._closed:
                        for note in db.notifies(timeout=RELISTEN_S):
                            on_change(note.payload)
            except self._psycopg.Error:
                heard.clear()
                time.sleep(RELISTEN_S)
        heard.clear()

    def touch(self, code: str, now: float) -> None:
        with self._run("note the room's use") as db:
            db.execute("UPDATE rooms SET touched = %s WHERE code = %s", (now, code))

    def open_count(self) -> int:
        with self._run("count the rooms") as db:
            return db.execute("SELECT COUNT(*) FROM rooms").fetchone()[0]

    def delete_idle(self, before: float) -> list[str]:
        with self._run("remove expired rooms") as db:
            return [row[0] for row in db.execute("DELETE FROM rooms WHERE touched < %s RETURNING code", (before,))]

    # ---- the presenter's browsers ----------------------------------------------------------

    def trust(self, code: str, browser: str, now: float, keep: int) -> None:
        with self._run("note the presenter's browser") as db, db.transaction():
            db.execute("INSERT INTO presenter_browsers VALUES (%s, %s, %s) ON CONFLICT (code, browser) DO UPDATE "
                       "SET trusted = excluded.trusted", (code, browser, now))
            db.execute("DELETE FROM presenter_browsers WHERE code = %s AND browser NOT IN (SELECT browser FROM "
                       "presenter_browsers WHERE code = %s ORDER BY trusted DESC, browser LIMIT %s)",
                       (code, code, keep))

    def trusts(self, code: str, browser: str) -> bool:
        with self._run("look up the presenter's browser") as db:
            return db.execute("SELECT 1 FROM presenter_browsers WHERE code = %s AND browser = %s",
                              (code, browser)).fetchone() is not None

    # ---- students and guesses --------------------------------------------------------------

    def join(self, code: str, student: str, name: str | None, now: float) -> str:
        with self._run("note a student") as db:
            return db.execute(
                "INSERT INTO students VALUES (%s, %s, COALESCE(%s::text, ''), %s) ON CONFLICT (code, student) "
                "DO UPDATE SET name = COALESCE(%s::text, students.name) RETURNING name",
                (code, student, name, now, name)).fetchone()[0]

    def student_count(self, code: str) -> int:
        with self._run("count the students") as db:
            return db.execute("SELECT COUNT(*) FROM students WHERE code = %s", (code,)).fetchone()[0]

    def is_student(self, code: str, student: str) -> bool:
        with self._run("look up a student") as db:
            return db.execute("SELECT 1 FROM students WHERE code = %s AND student = %s",
                              (code, student)).fetchone() is not None

    def guess(self, code: str, context: str, student: str, text: str, token_id: int, now: float) -> None:
        with self._run("save a guess") as db:
            db.execute("INSERT INTO guesses VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (code, context, student) "
                       "DO UPDATE SET text = excluded.text, token_id = excluded.token_id, made = excluded.made",
                       (code, context, student, text, token_id, now))

    def guesses(self, code: str, contexts: tuple[str, ...] | None = None) -> list[GuessRow]:
        query = ("SELECT g.context, g.student, COALESCE(s.name, ''), g.text, g.token_id FROM guesses g "
                 "LEFT JOIN students s ON s.code = g.code AND s.student = g.student WHERE g.code = %s")
        params: list[object] = [code]
        if contexts is not None:
            query += " AND g.context = ANY(%s)"
            params.append(list(contexts))
        with self._run("read the guesses") as db:
            return [GuessRow(*row) for row in db.execute(query + " ORDER BY g.made", params)]

    # ---- the quiz --------------------------------------------------------------------------

    def open_quiz(self, code: str, phase: str, now: float) -> None:
        with self._run("open the quiz") as db:
            db.execute("INSERT INTO quiz_phases VALUES (%s, %s, %s, NULL) ON CONFLICT (code, phase) DO UPDATE "
                       "SET closed = NULL", (code, phase, now))

    def close_quiz(self, code: str, now: float) -> None:
        with self._run("close the quiz") as db:
            db.execute("UPDATE quiz_phases SET closed = %s WHERE code = %s AND closed IS NULL", (now, code))

    def open_phase(self, code: str) -> str | None:
        with self._run("read the quiz") as db:
            row = db.execute("SELECT phase FROM quiz_phases WHERE code = %s AND closed IS NULL", (code,)).fetchone()
        return row[0] if row else None

    def answer(self, code: str, phase: str, student: str, answers: dict[int, int], now: float) -> None:
        with self._run("save quiz answers") as db:
            db.cursor().executemany(
                "INSERT INTO quiz_answers VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (code, phase, student, question) "
                "DO UPDATE SET choice = excluded.choice, made = excluded.made",
                [(code, phase, student, q, c, now) for q, c in answers.items()])

    def quiz_answers(self, code: str) -> list[AnswerRow]:
        with self._run("read quiz answers") as db:
            return [AnswerRow(*row) for row in db.execute(
                "SELECT phase, student, question, choice FROM quiz_answers WHERE code = %s ORDER BY made", (code,))]


def _said(exc: Exception) -> str:
    """The driver's message, first line only, with any connection URL taken out."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"postgres(?:ql)?://\S+", "(the database URL)", first)
