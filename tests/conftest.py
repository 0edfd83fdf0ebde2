"""Shared fixtures, and the markers that split the suite by cost.

`model`: the test loads the real bundled model (the `lm` fixture) or runs the app in
AppTest (whose first run loads it); given automatically, so no test can forget it.
`browser`: drives the real app in headless Chromium (set by the browser tests' modules).
`make test-fast` runs what has neither: engine and view tests on tiny models and plain data.
"""

from __future__ import annotations

import functools

import pytest

from engine import LoadedModel, load_model
from tests.tiny import tiny_lm as build_tiny_lm


def _runs_the_model(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return "lm" in getattr(item, "fixturenames", ()) or (module is not None and hasattr(module, "AppTest"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _runs_the_model(item):
            item.add_marker(pytest.mark.model)


@functools.cache
def bundled_lm() -> LoadedModel:
    """The real SmolLM2-135M-Instruct from the bundled GGUF (warm from the user cache), loaded
    once per session: the `lm` fixture's, and the app's in AppTest (tests/ui/conftest.py)."""
    return load_model()


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """The real SmolLM2-135M-Instruct from the bundled GGUF (warm from the user cache)."""
    return bundled_lm()


@pytest.fixture(scope="session")
def tiny_lm() -> LoadedModel:
    """A tiny random Llama over a byte-level tokenizer (tests/tiny.py): builds in a moment."""
    return build_tiny_lm()


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the session (bench/postgres.py). Missing binaries fail in CI
    (.ci/run installs Debian's `postgresql`) and skip elsewhere."""
    import os

    from bench.postgres import binaries, postgres_server

    if binaries() is None:
        message = "no PostgreSQL server binaries: install Debian's `postgresql` (CI does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with postgres_server() as url:
        yield url
