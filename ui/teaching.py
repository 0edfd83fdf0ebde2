"""What the three teaching pages share on screen: honouring the sidebar's presentation mode."""

from __future__ import annotations

import streamlit as st

from ui.state import PRESENTATION

# Larger type for a projector, the same scale the Step-through page uses in this mode.
PRESENTATION_CSS = "<style>html{font-size:22px}.tbt-chips{font-size:1.3rem}</style>"


def page_style() -> None:
    """Apply presentation mode (the sidebar toggle) to the page being drawn."""
    if st.session_state.get(PRESENTATION):
        st.html(PRESENTATION_CSS)
