"""Make sure a page is drawn inside the app's frame (app.py), however the visitor arrived.

Streamlit decides, when the first visitor after a server start connects, whether the app is an
old-style multipage app: it is if a `pages/` folder sits beside the main script. Until app.py's
`st.navigation` has run once, each run then goes through Streamlit's automatic navigation, which
runs a page script straight from its URL. So the first visitor arriving on a page's own link
(/lesson, /sampler_lab, /kv_speed) got the page with no model sidebar and an automatic menu of
file names. Every page calls `ensure_app_frame()` first: it switches that mode off (exactly what
`st.navigation` does) and reruns, and the rerun goes through app.py to the same page.

Only a visitor's first run is rerun: a rerun drops the run's button clicks, and a first run has
none. (Streamlit's AppTest starts every run in that mode; its later runs stay as they are.)
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager  # pinned Streamlit (1.67): see requirements.txt

from ui.keys import APP


def ensure_app_frame() -> None:
    """On a visitor's first run, rerun through app.py if Streamlit ran this page on its own."""
    if PagesManager.uses_pages_directory and not st.session_state.get(APP.frame_checked):
        st.session_state[APP.frame_checked] = True
        PagesManager.uses_pages_directory = False
        st.rerun()
