"""This server's deployment (engine/serving/deployment.py), read once from the environment."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from typing import Any

from engine import Limits, TraceError
from engine.serving import Deployment, IdleReleaser, deployment_from_env
from ui.format import duration


@cache
def current_deployment() -> Deployment:
    """The deployment the server was started with (TBT_* variables; the local defaults when
    none is set). Raises SettingsError naming a bad variable."""
    return deployment_from_env()


def downloadable(trace: dict[str, Any]) -> str:
    """A trace as the visitor downloads it: JSON, without the server's paths where the
    deployment hides them."""
    return json.dumps(current_deployment().shareable_trace(trace), indent=1, ensure_ascii=False)


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
