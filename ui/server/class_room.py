"""The Class page's server objects: the one ClassHall of this server (its rooms live in the
SQLite file of ui/server/deployment.py's class_settings), its quiz, the wrong-code throttle, and
who a browser is."""

from __future__ import annotations

import hashlib
import threading
from functools import cache

import streamlit as st

from classroom import ClassHall, RoomStore, WrongCodeThrottle
from classroom.quiz import Question, QuizError, load_quiz
from classroom.store_pg import PostgresRoomStore
from engine import BUNDLED
from ui.server.deployment import class_settings, current_deployment, rebuild_limits, rooms_url
from ui.server.model import shared_model_and_scheduler

# Plain dictionaries, not st.cache_resource: a follower's run asks for the hall several times, and
# each cached call's hashing and bookkeeping was a visible share of that run's CPU (a py-spy
# profile of `bench.class_bench`; figures in docs/benchmarks.md). Made once per server process,
# as st.cache_resource would.
_halls: dict[str, ClassHall] = {}
_halls_lock = threading.Lock()


def current_hall() -> ClassHall:
    """This server's rooms, on the bundled model, in TBT_ROOMS_URL's PostgreSQL database when it
    names one, else in the SQLite file (raises StoreError when the database cannot be opened; a
    later run tries again)."""
    url = rooms_url()
    where = url or str(class_settings()[0])
    if (hall := _halls.get(where)) is not None:
        return hall
    with _halls_lock:
        if where not in _halls:
            lm, scheduler = shared_model_and_scheduler(BUNDLED)
            store = PostgresRoomStore(url) if url else RoomStore(where)
            hall = ClassHall(store, lm, class_settings()[1], rebuild_limits(), scheduler, quiz=class_quiz()[0])
            hall.watch()  # another process's change to a room reaches this one's students at once
            _halls[where] = hall
        return _halls[where]


@cache
def class_quiz() -> tuple[tuple[Question, ...], str | None]:
    """The quiz's questions (assets/class_quiz.json), and why there are none if the file is wrong:
    the presenter is told, and the class goes on without a quiz."""
    try:
        return load_quiz(), None
    except QuizError as exc:
        return (), str(exc)


@cache
def wrong_codes() -> WrongCodeThrottle:
    """One throttle for the whole server."""
    return WrongCodeThrottle()


def browser_key() -> str:
    """Who this browser is, as far as the server can tell without accounts: the token in
    Streamlit's own XSRF cookie where the browser sends one (the same across reloads and tabs),
    else its address."""
    cookie = st.context.cookies.get("_streamlit_xsrf") if st.context.cookies else None
    if (token := xsrf_token(cookie)) is not None:
        return "cookie:" + hashlib.sha256(token).hexdigest()[:24]
    address = st.context.ip_address
    return "address:" + (address if isinstance(address, str) else "unknown")


def xsrf_token(cookie: object) -> bytes | None:
    """The token inside an XSRF cookie. The server re-masks it with fresh random bytes on every
    page it sends ("2|mask|masked token|time"), so the cookie's text changes on each reload while
    the token stays: a browser is known by the unmasked token. A plain hex token (version 1) is
    its own token."""
    if not isinstance(cookie, str) or not cookie:
        return None
    parts = cookie.split("|")
    try:
        if len(parts) == 4 and parts[0] == "2":
            mask, masked = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
            return bytes(b ^ mask[i % len(mask)] for i, b in enumerate(masked)) if mask and masked else None
        return bytes.fromhex(cookie) if len(parts) == 1 else None
    except ValueError:
        return None


def store_problem(exc: Exception) -> str:
    """A store error as a visitor may read it (no server path in the public preset)."""
    return current_deployment().describe_error(exc)
