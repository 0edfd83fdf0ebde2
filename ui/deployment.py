"""This server's deployment (engine/deployment.py), read once from the environment."""

from __future__ import annotations

from functools import cache

from engine.deployment import Deployment, deployment_from_env


@cache
def current_deployment() -> Deployment:
    """The deployment the server was started with (TBT_* variables; the local defaults when
    none is set). Raises SettingsError naming a bad variable."""
    return deployment_from_env()
