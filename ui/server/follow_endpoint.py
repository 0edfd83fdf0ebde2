"""The Class page's follow endpoint (classroom/follow.py), one per server process: a small HTTP
server on a port of its own, started the first time a student's page follows a room.

    TBT_FOLLOW_PORT=N    its port (default: Streamlit's port + 1, 8502 for 8501); 0 turns it off
    TBT_FOLLOW_URL=URL   where browsers reach it when that is not this host at that port (a proxy:
                         https://example.org/follow); the page polls URL + /rooms/…

When the port cannot be bound, the endpoint is off and students follow with their fragment's timer
alone (the server's log says why).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import streamlit as st

from classroom import ClassHall
from classroom.follow import FollowApp, FollowLimits, follow_token, serve
from engine import SettingsError
from ui.views.class_room import follow_html

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class FollowSettings:
    port: int  # 0: off
    public_url: str  # "": the page's own host, at `port`
    host: str  # the address to bind (Streamlit's server.address; all interfaces when it has none)


@dataclass(frozen=True)
class FollowAddress:
    """Where a page polls its room: `base` (or, when empty, the page's own host at `port`) + `path`."""

    base: str
    port: int
    path: str  # /rooms/<code>/version?token=…; the page adds &after=<version>


def follow_settings(environ: Mapping[str, str], streamlit_port: int, streamlit_address: str | None) -> FollowSettings:
    """The endpoint's settings from TBT_FOLLOW_* (raises SettingsError naming a bad one)."""
    text = environ.get("TBT_FOLLOW_PORT", "").strip()
    if not text:
        port = streamlit_port + 1
    elif text.isdigit() and int(text) <= 65535:
        port = int(text)
    else:
        raise SettingsError("TBT_FOLLOW_PORT", text, "a port from 1 to 65535, or 0 for none")
    public_url = environ.get("TBT_FOLLOW_URL", "").strip().rstrip("/")
    if public_url and not public_url.startswith(("http://", "https://")):
        raise SettingsError("TBT_FOLLOW_URL", public_url, "an http:// or https:// address")
    return FollowSettings(port, public_url, streamlit_address or "0.0.0.0")


@dataclass
class _Endpoint:
    app: FollowApp
    settings: FollowSettings
    key: bytes


_endpoints: dict[int, _Endpoint | None] = {}  # id(hall) -> its endpoint (None: off)
_lock = threading.Lock()


def follow_address(hall: ClassHall, code: str) -> FollowAddress | None:
    """Where a student's page polls room `code`; None when the endpoint is off (the page's timer
    alone then). The first call starts the endpoint."""
    endpoint = _endpoints.get(id(hall)) if id(hall) in _endpoints else _started(hall)
    if endpoint is None:
        return None
    path = f"/rooms/{code}/version?token={follow_token(endpoint.key, code)}"
    return FollowAddress(endpoint.settings.public_url, endpoint.settings.port, path)


def student_view(hall: ClassHall, code: str) -> tuple[int, str] | None:
    """Room `code`'s version and what every student sees of it above their own controls (built
    once per version, ui/views/class_room.py), for the endpoint to send with the version."""
    if (snapshot := hall.snapshot(code)) is None:
        return None
    return snapshot.version, follow_html(snapshot)[0]


def _started(hall: ClassHall) -> _Endpoint | None:
    with _lock:
        if id(hall) not in _endpoints:
            _endpoints[id(hall)] = _start(hall)
        return _endpoints[id(hall)]


def _start(hall: ClassHall) -> _Endpoint | None:
    settings = follow_settings(os.environ, st.get_option("server.port"), st.get_option("server.address"))
    if not settings.port:
        return None
    try:
        sock = socket.create_server((settings.host, settings.port), reuse_port=False)
    except OSError as exc:
        LOG.warning("The Class follow endpoint could not take port %s (%s): students follow with their "
                    "page's timer alone.", settings.port, exc)
        return None
    key = secrets.token_bytes(32)
    app = FollowApp(hall.version, key, FollowLimits(per_room=hall.limits.max_students),
                    view_of=lambda code: student_view(hall, code))
    hall.on_version(app.announce)
    serve(app, sock)
    return _Endpoint(app, settings, key)

