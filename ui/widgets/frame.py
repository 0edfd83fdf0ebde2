"""Make sure a page is drawn inside the app's frame (app.py), however the visitor arrived.

Streamlit decides, when the first visitor after a server start connects, whether the app is an
old-style multipage app: it is if a `pages/` folder sits beside the main script, and no setting
turns that off. Until `st.navigation` has run once in the process, each run then goes through
Streamlit's automatic navigation, which runs a page script straight from its URL. So the first
visitor arriving on a page's own link (/lesson, /sampler_lab, /kv_speed) got the page with no
model sidebar and an automatic menu of file names.

Every page calls `ensure_app_frame()` first. A run that came through app.py is marked so (app.py
calls `mark_framed_run`); on a visitor's first run that was not, the page calls the public
`st.navigation` with the app's own pages (which is what makes Streamlit leave its old mode, for
the whole process) and reruns: the rerun keeps the URL and its query, goes through app.py and
lands on the same page, since a page's URL path is the same in both modes.

Only a visitor's first run is rerun: a rerun drops the run's button clicks, and a first run has
none. (Streamlit's AppTest starts every run in the old mode; its later runs stay as they are.)
This module is the whole workaround: tests/ui/test_frame.py checks its rule and that every page
and app.py take part; tests/browser/test_fresh_server.py checks it on a real server.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui.session.keys import APP

ROOT = Path(__file__).resolve().parents[2]


def app_pages() -> list[st.Page]:
    """The app's pages, in the sidebar's order; app.py navigates between them."""
    pages = ROOT / "pages"
    return [
        st.Page(pages / "step_through.py", title="Step through", icon=":material/play_arrow:", default=True),
        st.Page(pages / "sampler_lab.py", title="Sampler lab", icon=":material/tune:"),
        st.Page(pages / "kv_speed.py", title="KV cache & speed", icon=":material/memory:"),
        st.Page(pages / "breaking_the_chain.py", title="Breaking the chain", icon=":material/fast_forward:"),
        st.Page(pages / "determinism.py", title="Same prompt, different answers", icon=":material/shuffle:"),
        st.Page(pages / "lesson.py", title="Lesson", icon=":material/school:"),
        st.Page(pages / "class.py", title="Class", icon=":material/groups:"),
    ]


def mark_framed_run() -> None:
    """app.py: this run goes through the frame (the page it runs reads and clears the mark)."""
    st.session_state[APP.framed_run] = True


def ensure_app_frame() -> None:
    """On a visitor's first run, rerun through app.py if Streamlit ran this page on its own."""
    framed = st.session_state.pop(APP.framed_run, False)
    if not framed and not st.session_state.get(APP.frame_checked):
        st.session_state[APP.frame_checked] = True
        st.navigation(app_pages(), position="hidden")  # an app that navigates is no longer a pages/ app
        st.rerun()
