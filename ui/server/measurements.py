"""The server's one board of speed measurements, shared by every visitor, and how busy its
scheduler has been: what the KV cache & speed page reads to say how loaded the server was
while a measurement ran."""

from __future__ import annotations

import streamlit as st

from ui.server.measurement_board import MeasurementBoard
from ui.server.model import current_scheduler


@st.cache_resource
def measurement_board() -> MeasurementBoard:
    """The server's one board of speed measurements, shared by every visitor (ui/server/measurement_board.py)."""
    return MeasurementBoard()


def tokens_served() -> int:
    """Tokens the current model's scheduler has made for visitors since the server started."""
    return current_scheduler().stats().tokens
