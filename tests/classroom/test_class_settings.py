"""The rooms' database path and caps, from TBT_CLASS_* and the deployment's preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import SettingsError
from ui.server import deployment


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in (*deployment.CLASS_VARIABLES, "TBT_PRESET", "TOKEN_BY_TOKEN_DATA", "TOKEN_BY_TOKEN_CACHE"):
        monkeypatch.delenv(name, raising=False)
    deployment.class_settings.cache_clear()
    deployment.current_deployment.cache_clear()
    yield
    deployment.class_settings.cache_clear()
    deployment.current_deployment.cache_clear()


def test_the_database_lives_in_the_data_folder_unless_a_path_is_given(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKEN_BY_TOKEN_DATA", str(tmp_path / "data"))
    assert deployment.class_settings()[0] == tmp_path / "data" / "class.sqlite3"
    deployment.class_settings.cache_clear()
    monkeypatch.setenv("TBT_CLASS_DB", str(tmp_path / "rooms.db"))
    assert deployment.class_settings()[0] == tmp_path / "rooms.db"


def test_the_public_preset_has_lower_caps_and_a_variable_overrides_one(monkeypatch) -> None:
    monkeypatch.setenv("TBT_PRESET", "public")
    monkeypatch.setenv("TBT_CLASS_MAX_STUDENTS", "61")
    limits = deployment.class_settings()[1]
    assert (limits.max_rooms, limits.max_students, limits.idle_hours) == (20, 61, 4.0)


@pytest.mark.parametrize(("variable", "value"), [("TBT_CLASS_MAX_ROOMS", "0"), ("TBT_CLASS_MAX_ROOMS", "many"),
                                                 ("TBT_CLASS_IDLE_HOURS", "-2")])
def test_a_bad_variable_is_refused_by_name(monkeypatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        deployment.class_settings()
