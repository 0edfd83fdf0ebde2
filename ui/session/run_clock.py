"""Run: a page's Step over and over, one step per rerun, each kept on screen for a frame.

Streamlit does not interrupt a fragment for another fragment's click, so a Run takes one step
per rerun and a Stop click is handled between two steps. Every page that runs (Step through,
Breaking the chain, the Class page's presenter) keeps its Run in the visitor's state under two
keys of its own, through one `RunClock`; ui/widgets/run.py queues the next rerun. No Streamlit here.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

# Each step of a Run stays on screen at least this long. The server makes a token several times
# faster than a browser on a small machine draws the workspace: unpaced, tokens queued up in the
# browser, it fell seconds behind the server, and Stop seemed ignored (`bench.ui_bench`).
RUN_FRAME_S = 0.3


@dataclass(frozen=True)
class RunClock:
    """A page's Run: whether it is running, and when its latest step began (time.monotonic())."""

    running: str  # the state key of the running flag
    frame_started: str  # the state key of the latest step's start

    def start(self, state: MutableMapping[str, Any]) -> None:
        state[self.running] = True

    def stop(self, state: MutableMapping[str, Any]) -> None:
        state[self.running] = False

    def is_running(self, state: Mapping[str, Any]) -> bool:
        return bool(state.get(self.running))

    def frame_begins(self, state: MutableMapping[str, Any], now: float) -> None:
        """A step of the Run begins (`now`: time.monotonic())."""
        state[self.frame_started] = now

    def frame_wait(self, state: Mapping[str, Any], now: float) -> float:
        """Seconds to wait before the Run's next step, so this one stays on screen RUN_FRAME_S."""
        started = state.get(self.frame_started, now)
        return max(0.0, RUN_FRAME_S - (now - started))
