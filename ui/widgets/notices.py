"""A message beside a control, drawn as its level says (ui/session/settings.py Message): a page
reads the level the controller gave, never the text."""

from __future__ import annotations

import streamlit as st

from ui.session.settings import Message
from ui.views.format import plain

LEVEL_ICONS = {"error": ":material/back_hand:", "warning": ":material/back_hand:", "info": ":material/info:",
               "success": ":material/check_circle:"}


def show_notice(note: Message, icon: str | None = None) -> None:
    """st.error, st.warning, st.info or st.success, by the message's level, with that level's icon
    unless told."""
    draw = {"error": st.error, "warning": st.warning, "info": st.info, "success": st.success}[note.level]
    draw(plain(note.text), icon=icon or LEVEL_ICONS[note.level])
