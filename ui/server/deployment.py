"""This server's deployment (engine/serving/deployment.py), read once from the environment."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from classroom import ClassLimits
from engine import Generation, Limits, SettingsError, TraceError, generation_recording, to_trace
from engine.serving import Deployment, IdleReleaser, deployment_from_env
from ui.views.format import duration


@cache
def current_deployment() -> Deployment:
    """The deployment the server was started with (TBT_* variables; the local defaults when
    none is set). Raises SettingsError naming a bad variable."""
    return deployment_from_env()


def downloadable(trace: dict[str, Any]) -> str:
    """A trace as the visitor downloads it: JSON, without the server's paths where the
    deployment hides them."""
    return json.dumps(current_deployment().shareable_trace(trace), indent=1, ensure_ascii=False)


def downloadable_recording(generation: Generation, share_query: str) -> str:
    """A generation's recording (engine/recording.py) as the visitor downloads it: its trace
    without the server's paths where the deployment hides them, and the share link's query."""
    return generation_recording(generation, current_deployment().shareable_trace(to_trace(generation)), share_query)


@cache
def idle_releaser() -> IdleReleaser:
    """The server's one IdleReleaser: a tab left idle for TBT_IDLE_MINUTES has its generation
    put away (its records stay; it is rebuilt from its steps when the visitor comes back)."""
    minutes = current_deployment().idle_minutes
    return IdleReleaser(minutes * 60, check_every_s=min(60.0, minutes * 15))


def rebuild_limits() -> Limits:
    """The caps on rebuilding a visitor's own generation after an idle release: its steps were
    already paid for once, so no replay time cap; the step cap stays."""
    return replace(current_deployment().limits, replay_seconds=None)


def put_away(subject: str) -> str:
    """What became of `subject` ("Your generation was") while its tab sat idle."""
    return f"{subject} put away after {duration(idle_releaser().idle_s)} idle to free the server's memory"


def upload_problem(name: str, size: int) -> str | None:
    """Why the uploaded trace `name` of `size` bytes is refused, checked before it is read
    ("name: reason"); None when it may be read."""
    try:
        current_deployment().limits.check_upload(size)
    except TraceError as exc:
        return f"{name}: {exc}"
    return None


# ---- the Class page's rooms (classroom/) ------------------------------------------------------
#   TBT_CLASS_DB=PATH           the rooms' SQLite file (default: class.sqlite3 in the app's data folder)
#   TBT_CLASS_MAX_ROOMS=N       open rooms at once
#   TBT_CLASS_MAX_STUDENTS=N    students who may join one room
#   TBT_CLASS_IDLE_HOURS=H      a room unused this long is deleted
#   TBT_ROOMS_URL=URL           a PostgreSQL database for the rooms instead of the file, so that several
#                               app processes serve one class (postgresql://user:password@host/database)

CLASS_LIMITS = {"local": ClassLimits(max_rooms=50, max_students=100, idle_hours=12.0),
                "public": ClassLimits(max_rooms=20, max_students=80, idle_hours=4.0)}
CLASS_VARIABLES = ("TBT_CLASS_DB", "TBT_CLASS_MAX_ROOMS", "TBT_CLASS_MAX_STUDENTS", "TBT_CLASS_IDLE_HOURS",
                   "TBT_ROOMS_URL")
ROOMS_URL = "TBT_ROOMS_URL"


def rooms_url() -> str | None:
    """The PostgreSQL database the rooms live in, when TBT_ROOMS_URL names one (else the file)."""
    return os.environ.get(ROOMS_URL, "").strip() or None


def data_folder() -> Path:
    """Where the app keeps what it must not lose: TOKEN_BY_TOKEN_DATA, else the same folder as
    the model cache when TOKEN_BY_TOKEN_CACHE names one (the Docker image's volume), else the
    user's data folder."""
    for variable in ("TOKEN_BY_TOKEN_DATA", "TOKEN_BY_TOKEN_CACHE"):
        if folder := os.environ.get(variable):
            return Path(folder).expanduser()
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "token-by-token"


def _class_number(environ: dict[str, str], name: str, whole: bool) -> dict[str, float]:
    """{field: value} for TBT_CLASS_<name> when it is set (raises SettingsError naming it)."""
    variable = f"TBT_CLASS_{name}"
    if variable not in environ:
        return {}
    text = environ[variable].strip()
    try:
        value: float = int(text) if whole else float(text)
    except ValueError:
        value = -1
    if not 0 < value < float("inf"):
        raise SettingsError(variable, text, "a whole number >= 1" if whole else "a number of hours > 0")
    return {name.lower(): value}


@cache
def class_settings() -> tuple[Path, ClassLimits]:
    """The rooms' database file and the caps on rooms, from TBT_CLASS_* and the preset."""
    environ = dict(os.environ)
    limits = replace(CLASS_LIMITS[current_deployment().preset], **_class_number(environ, "MAX_ROOMS", True),
                     **_class_number(environ, "MAX_STUDENTS", True), **_class_number(environ, "IDLE_HOURS", False))
    given = environ.get("TBT_CLASS_DB")
    path = Path(given).expanduser() if given else data_folder() / "class.sqlite3"
    return path, limits
