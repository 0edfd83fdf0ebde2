"""The visitor's theme, light or dark, as Streamlit tells the script (ui/views/theme.py holds
the colours of each; views take the theme as an argument and never ask Streamlit)."""

from __future__ import annotations

import streamlit as st

from ui.views.theme import DARK, LIGHT, ChartTheme


def current_theme() -> ChartTheme:
    """The theme of the visitor's browser; light outside a Streamlit run (tests) or before the
    browser has said."""
    return DARK if st.context.theme.type == "dark" else LIGHT
