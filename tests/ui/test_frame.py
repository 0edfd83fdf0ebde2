"""The first visit on a page's own link goes through the app's frame (ui/widgets/frame.py), the
one place that works around Streamlit's pages/ mode: fast checks of its rule without a server.
(tests/browser/test_fresh_server.py proves it on a real server and browser.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ui.session.keys import APP
from ui.widgets import frame

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "pages").glob("*.py"))


class RerunCalled(Exception):
    """st.rerun ends the run; here it only says it was called."""


@pytest.fixture()
def streamlit(monkeypatch) -> dict:
    """The visitor's session state and what the frame asked Streamlit to do."""
    calls: dict = {"state": {}, "navigation": [], "reruns": 0}

    def rerun() -> None:
        calls["reruns"] += 1
        raise RerunCalled

    monkeypatch.setattr(frame.st, "session_state", calls["state"])
    monkeypatch.setattr(frame.st, "navigation", lambda pages, position: calls["navigation"].append(position))
    monkeypatch.setattr(frame.st, "rerun", rerun)
    return calls


def test_a_run_through_the_app_draws_the_page_as_it_is(streamlit: dict) -> None:
    frame.mark_framed_run()
    frame.ensure_app_frame()
    assert streamlit["reruns"] == 0 and not streamlit["navigation"]
    assert APP.framed_run not in streamlit["state"]  # read and cleared: the next run must mark again


def test_a_first_run_outside_the_frame_navigates_and_reruns_once(streamlit: dict) -> None:
    with pytest.raises(RerunCalled):
        frame.ensure_app_frame()
    assert streamlit["navigation"] == ["hidden"] and streamlit["reruns"] == 1
    frame.ensure_app_frame()  # a later run of the same visitor (AppTest's old mode): no second rerun
    assert streamlit["reruns"] == 1


def test_the_frame_lists_every_page_once(monkeypatch) -> None:
    monkeypatch.setattr(frame.st, "Page", lambda path, **_: Path(path))
    assert sorted(frame.app_pages()) == PAGES


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_page_checks_the_frame_before_anything_else(path: Path) -> None:
    main = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "main")
    first = main.body[1] if isinstance(main.body[0], ast.Expr) and isinstance(main.body[0].value, ast.Constant) \
        else main.body[0]
    assert ast.unparse(first) == "ensure_app_frame()"


def test_the_app_marks_its_runs_before_running_a_page() -> None:
    calls = [ast.unparse(n) for n in ast.parse((ROOT / "app.py").read_text()).body if isinstance(n, ast.Expr)]
    assert calls.index("mark_framed_run()") < calls.index("navigation.run()")
