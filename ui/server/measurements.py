"""The server's one board of speed measurements, shared by every visitor, and how busy its
scheduler has been: what the KV cache & speed page reads to say how loaded the server was
while a measurement ran."""

from __future__ import annotations

import streamlit as st

from engine import LoadedModel
from engine.speed import PrefillCost, measure_prefill_cost
from ui.server.measurement_board import MeasurementBoard
from ui.server.model import current_scheduler


@st.cache_resource
def shared_board() -> MeasurementBoard:
    """The server's one board of speed measurements, shared by every visitor (ui/server/measurement_board.py)."""
    return MeasurementBoard()


def tokens_served() -> int:
    """Tokens the current model's scheduler has made for visitors since the server started."""
    return current_scheduler().stats().tokens


def prefill_cost(lm: LoadedModel) -> PrefillCost:
    """What reading a prompt costs on this server, measured once for everyone (two prompt
    lengths, about a second) the first time a visitor's prompt is long."""
    return shared_board().get(("prefill cost", lm.name), lambda: measure_prefill_cost(lm), tokens_served).value
