"""This server's deployment (engine/deployment.py), read once from the environment."""

from __future__ import annotations

from functools import cache

from engine.deployment import Deployment, deployment_from_env
from engine.idle import IdleReleaser


@cache
def current_deployment() -> Deployment:
    """The deployment the server was started with (TBT_* variables; the local defaults when
    none is set). Raises SettingsError naming a bad variable."""
    return deployment_from_env()


@cache
def idle_releaser() -> IdleReleaser:
    """The server's one IdleReleaser: a tab left idle for TBT_IDLE_MINUTES has its generation
    put away (its records stay; it is rebuilt from its steps when the visitor comes back)."""
    minutes = current_deployment().idle_minutes
    return IdleReleaser(minutes * 60, check_every_s=min(60.0, minutes * 15))
