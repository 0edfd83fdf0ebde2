"""The Class page's server objects: the one ClassHall of this server (its rooms live in the
SQLite file of ui/server/deployment.py's class_settings), the wrong-code throttle, and who a browser is."""

from __future__ import annotations

import hashlib
import threading
from functools import cache

import streamlit as st

from classroom import ClassHall, RoomStore, WrongCodeThrottle
from engine import BUNDLED
from ui.server.deployment import class_settings, current_deployment, rebuild_limits
from ui.server.model import shared_model_and_scheduler

# Plain dictionaries, not st.cache_resource: a follower's run asks for the hall several times, and
# each cached call's hashing and bookkeeping was a tenth of that run's CPU (a py-spy profile of
# `bench.class_bench`). Made once per server process, as st.cache_resource would.
_halls: dict[str, ClassHall] = {}
_halls_lock = threading.Lock()


def current_hall() -> ClassHall:
    """This server's rooms, on the bundled model (raises StoreError when the database cannot be
    opened; a later run tries again)."""
    path = str(class_settings()[0])
    if (hall := _halls.get(path)) is not None:
        return hall
    with _halls_lock:
        if path not in _halls:
            lm, scheduler = shared_model_and_scheduler(BUNDLED)
            _halls[path] = ClassHall(RoomStore(path), lm, class_settings()[1], rebuild_limits(), scheduler)
        return _halls[path]


@cache
def wrong_codes() -> WrongCodeThrottle:
    """One throttle for the whole server."""
    return WrongCodeThrottle()


def browser_key() -> str:
    """Who this browser is, as far as the server can tell without accounts: Streamlit's own
    XSRF cookie where the browser sends one (the same across reloads), else its address."""
    cookie = st.context.cookies.get("_streamlit_xsrf") if st.context.cookies else None
    if isinstance(cookie, str) and cookie:
        return "cookie:" + hashlib.sha256(cookie.encode()).hexdigest()[:24]
    address = st.context.ip_address
    return "address:" + (address if isinstance(address, str) else "unknown")


def store_problem(exc: Exception) -> str:
    """A store error as a visitor may read it (no server path in the public preset)."""
    return current_deployment().describe_error(exc)
