"""Fixtures the UI tests share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from engine import LoadedModel
from engine.serving import IdleReleaser
from tests.conftest import bundled_lm
from ui.server import model as server_model
from ui.session import idle_rebuild, run_clock


@pytest.fixture(scope="session", autouse=True)
def server_shares_the_sessions_model() -> Iterator[None]:
    """The app in AppTest loads the bundled model as the session's other tests have it: one copy
    in memory, one load. Nothing in the app changes a model it loads (it looks inside through a
    twin with hooks of its own), so the tests of either see the same numbers. Any other source
    loads as the server loads it. (Not through the `lm` fixture: that would mark every UI test
    as one that runs the model.)"""
    load = server_model.load_model

    def load_model(source: str | None = None, device: str | None = None, **options) -> LoadedModel:
        if source is None and device is None and not options:
            return bundled_lm()
        return load(source, device=device, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server_model, "load_model", load_model)
        yield


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


@pytest.fixture(autouse=True)
def unpaced_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In AppTest a Run's steps follow each other at once: the frame each step is held for lets a
    browser draw it, and AppTest draws nothing. The clock's own tests (no AppTest) keep the real
    frame, and test_run_steps_until_max_new_tokens_and_disables_step sets one of its own."""
    if hasattr(request.module, "AppTest"):
        monkeypatch.setattr(run_clock, "RUN_FRAME_S", 0.0)
