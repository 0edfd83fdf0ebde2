"""The Class page's server objects: the one ClassHall of this server (its rooms live in the
SQLite file of ui/deployment.py's class_settings), the wrong-code throttle, and who a browser is."""

from __future__ import annotations

import hashlib

import streamlit as st

from classroom import ClassHall, RoomStore, WrongCodeThrottle
from engine import BUNDLED
from ui.deployment import class_settings, current_deployment, rebuild_limits
from ui.model import shared_model_and_scheduler


@st.cache_resource(show_spinner=False)
def _hall(path: str) -> ClassHall:
    lm, scheduler = shared_model_and_scheduler(BUNDLED)
    return ClassHall(RoomStore(path), lm, class_settings()[1], rebuild_limits(), scheduler)


def current_hall() -> ClassHall:
    """This server's rooms, on the bundled model (raises StoreError when the database cannot be
    opened; a later run tries again)."""
    return _hall(str(class_settings()[0]))


@st.cache_resource(show_spinner=False)
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
