"""Shared fixtures: the real bundled model, loaded once per test session."""

from __future__ import annotations

import pytest

from engine import LoadedModel, load_model


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """The real SmolLM2-135M-Instruct from the bundled GGUF (warm from the user cache)."""
    return load_model()
