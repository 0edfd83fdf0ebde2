"""Fixtures the UI tests share."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.serving import IdleReleaser
from ui.session import idle_rebuild


@dataclass
class IdleServer:
    """The server's idle releaser on a clock the test moves: `away(seconds)` is a visitor gone
    that long, then the releaser's sweep."""

    releaser: IdleReleaser
    now: float = 0.0

    def away(self, seconds: float) -> int:
        self.now += seconds
        return self.releaser.sweep()


@pytest.fixture()
def idle_server(monkeypatch) -> IdleServer:
    """Every controller's generations are touched through ui/session/idle_rebuild.py: here, on a
    releaser that puts away whatever was idle for 60 s, and only when the test says."""
    server = IdleServer(IdleReleaser(60, clock=lambda: server.now, check_every_s=None))
    monkeypatch.setattr(idle_rebuild, "idle_releaser", lambda: server.releaser)
    return server
