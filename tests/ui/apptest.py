"""Open the real app in AppTest the way a visitor reaches a page: the frame first, then the page."""

from __future__ import annotations

import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def open_page(page: str, session: dict | None = None, timeout: float = 240) -> AppTest:
    """Run app.py (with `session` preset in session_state), switch to `page`, and check that
    neither run raised."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in (session or {}).items():
        at.session_state[key] = value
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def as_read(markdown: str) -> str:
    """A message's Markdown as a visitor reads it: visitor text is shown escaped (ui.views.format.plain)."""
    return re.sub(r"\\(.)", r"\1", markdown).replace("  \n", "\n").replace("\u2060", "")
