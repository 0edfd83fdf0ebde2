"""The next step of a Run, queued: every page that runs continues through here."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import streamlit as st
from streamlit.errors import StreamlitAPIException

from ui.session.run_clock import RunClock


def continue_run(clock: RunClock, state: Mapping[str, Any]) -> None:
    """Once this step has been on screen for its frame, rerun for the next: the fragment alone,
    or the whole page when this run was not a fragment run."""
    time.sleep(clock.frame_wait(state, time.monotonic()))
    try:
        st.rerun(scope="fragment")
    except StreamlitAPIException:
        st.rerun()
