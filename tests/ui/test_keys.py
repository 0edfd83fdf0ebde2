"""ui/session/keys.py is the one list of session keys: each page's keys carry its prefix, no two
pages share one, and no page or ui module uses a key that is not listed."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from ui.session.keys import PAGES, STEP

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "ui").rglob("*.py")])
STATE_METHODS = {"get", "setdefault", "pop"}  # session_state methods whose first argument is a key
WIDGET_CALLS = {"form", "fragment"}  # st.form("key"), st.fragment(key=...) take a key too


def _is_session_state(node: ast.expr) -> bool:
    """`S` (each page's alias) or `st.session_state`."""
    return (isinstance(node, ast.Name) and node.id == "S") or (
        isinstance(node, ast.Attribute) and node.attr == "session_state")


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def literal_keys(source: str) -> set[str]:
    """Every string literal used as a session key: `key="…"`, `S["…"]`, `st.session_state["…"]`,
    `S.get("…")` (and setdefault, pop), and st.form's first argument."""
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _is_session_state(node.value):
            found.add(_literal(node.slice))
        elif isinstance(node, ast.Call):
            found.update(_literal(k.value) for k in node.keywords if k.arg == "key")
            func = node.func
            if isinstance(func, ast.Attribute) and node.args and (
                    (func.attr in STATE_METHODS and _is_session_state(func.value)) or func.attr in WIDGET_CALLS):
                found.add(_literal(node.args[0]))
    return {key for key in found if key is not None}


def registered() -> set[str]:
    return {key for page in PAGES for key in page.names()}


def test_every_key_carries_its_pages_prefix() -> None:
    for page in PAGES:
        assert page.names(), type(page).__name__
        wrong = [key for key in page.names() if not key.startswith(page.prefix)]
        assert not wrong, f"{type(page).__name__} keys without the prefix {page.prefix!r}: {wrong}"


def test_no_two_keys_are_the_same_and_prefixes_do_not_overlap() -> None:
    counts = Counter(key for page in PAGES for key in page.names())
    assert [key for key, n in counts.items() if n > 1] == []
    prefixes = [page.prefix for page in PAGES]
    assert not [(a, b) for a in prefixes for b in prefixes if a != b and b.startswith(a)]


def test_the_registry_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(FrozenInstanceError):
        STEP.step = "other"  # type: ignore[misc]


def test_the_scan_finds_each_way_a_key_is_written() -> None:
    source = ('S["st_a"]; st.session_state["lab_b"]; S.get("kv_c"); st.session_state.pop("app_d", None)\n'
              'st.button("x", key="lesson_e"); st.form("app_f"); other["not_a_key"]; d.get("nor_this")')
    assert literal_keys(source) == {"st_a", "lab_b", "kv_c", "app_d", "lesson_e", "app_f"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_literal_key_in_the_app_is_registered(path: Path) -> None:
    unknown = literal_keys(path.read_text()) - registered()
    assert not unknown, f"{path.name} uses session keys missing from ui/session/keys.py: {sorted(unknown)}"
