"""Waking a room's followers the moment the presenter changes the room (Streamlit 1.67's runtime).

A follower's fragment timer alone costs about 4-5 ms of server CPU a tick, whatever the page
draws (`bench.class_bench`): at the half second a 1 s follow delay needs, 2.8 % of a core per idle
student, where the goal is 1 %. So a follower's timer is slow (the page's FALLBACK_EVERY_S, for
presence and as a safety net) and every change to a room wakes its followers at once: each
follower session that drew the room's view is asked for a rerun of its follow fragment, exactly
the rerun its browser's timer would ask for, and the browser draws what that run sends.

This reaches into Streamlit's server runtime (its session manager and an AppSession's rerun
request, neither of them public API), pinned with Streamlit in requirements.txt. Where anything
is missing, `wake` does nothing and says so by its count: the follower's own timer still brings
it up to date, only later.
"""

from __future__ import annotations

import threading

from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState, get_script_run_ctx

WAKE_AT_LATEST_S = 0.3  # a change is sent to the followers when the presenter's run ends, or after this


class Followers:
    """The sessions following each room, and how to wake them.

    A change is not sent at once: the presenter's page is still drawing it, and 60 followers'
    runs beside that run made the presenter wait as long as the slowest follower (`bench.class_bench`).
    `changed` holds the wake until the presenter's run ends (`flush`), or WAKE_AT_LATEST_S."""

    def __init__(self) -> None:
        self._rooms: dict[str, dict[str, str]] = {}  # room code -> session id -> follow fragment id
        self._pending: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()

    def changed(self, code: str) -> None:
        """Room `code` changed: wake its followers when the presenter's run ends."""
        with self._lock:
            if code in self._pending:
                return
            timer = self._pending[code] = threading.Timer(WAKE_AT_LATEST_S, self.flush, args=(code,))
            timer.daemon = True
        timer.start()

    def flush(self, code: str) -> int:
        """Wake room `code`'s followers now if a change waits for it; returns how many were asked."""
        with self._lock:
            timer = self._pending.pop(code, None)
        if timer is None:
            return 0
        timer.cancel()
        return self.wake(code)

    def register(self, code: str) -> None:
        """Called inside a follower's fragment: this session follows room `code`."""
        ctx, fragment_id = get_script_run_ctx(suppress_warning=True), ThreadState.get().fragment_id
        if ctx is None or not fragment_id:
            return
        with self._lock:
            for sessions in self._rooms.values():  # a session follows one room at a time
                sessions.pop(ctx.session_id, None)
            self._rooms.setdefault(code, {})[ctx.session_id] = fragment_id

    def wake(self, code: str) -> int:
        """Ask every follower of room `code` for a rerun of its follow fragment; returns how many
        were asked (sessions gone are forgotten)."""
        if not Runtime.exists():
            return 0
        manager = getattr(Runtime.instance(), "_session_mgr", None)
        with self._lock:
            sessions = dict(self._rooms.get(code, {}))
        asked = 0
        for session_id, fragment_id in sessions.items():
            info = manager.get_active_session_info(session_id) if manager is not None else None
            session = getattr(info, "session", None)
            if session is None or not hasattr(session, "_client_state") or not hasattr(session, "_event_loop"):
                with self._lock:
                    self._rooms.get(code, {}).pop(session_id, None)
                continue
            state = ClientState()
            state.CopyFrom(session._client_state)
            state.ClearField("widget_states")  # no widget changed: the rerun replays no click
            state.fragment_id, state.is_auto_rerun = fragment_id, True
            session._event_loop.call_soon_threadsafe(session.request_rerun, state)
            asked += 1
        return asked
