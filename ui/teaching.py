"""Presentation mode (the sidebar toggle), shared by every page: larger type for a projector."""

from __future__ import annotations

import streamlit as st

from ui.keys import APP

# Every rem-sized thing scales up with the root font.
PRESENTATION_CSS = "<style>html{font-size:22px}.tbt-chips{font-size:1.3rem}</style>"


def page_style() -> None:
    """Apply presentation mode (the sidebar toggle) to the page being drawn."""
    if st.session_state.get(APP.presentation):
        st.html(PRESENTATION_CSS)
