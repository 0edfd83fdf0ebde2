"""Put away the generations of visitors who left their tab open and went away.

A visitor's generation holds its KV cache (46 KB a position on the bundled model) and its
kept logits for as long as the tab is open; Streamlit only drops a session once the tab is
closed. An IdleReleaser closes (Generation.close) every generation nobody has touched for
`idle_s` seconds. The records stay, so the page can still show them, and the steps are
enough to rebuild the generation exactly (engine.trace.replay) when the visitor comes back.

Touching and closing happen under one lock, so a generation touched just now is never
closed: a visitor who comes back either finds it open, or finds it closed before their
click and has it rebuilt.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

from engine.errors import SettingsError


class Closable(Protocol):
    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class IdleReleaser:
    """Closes the registered generations idle for `idle_s` seconds; holds them by weak
    reference only, so a generation a visitor dropped is not kept alive by this.

    Args:
        idle_s: seconds without a touch before a generation is closed.
        clock: the time source (time.monotonic; tests give their own).
        check_every_s: how often the background sweep runs; None runs none (call `sweep`).
    """

    def __init__(self, idle_s: float, *, clock: Callable[[], float] = time.monotonic,
                 check_every_s: float | None = 60.0) -> None:
        if not isinstance(idle_s, int | float) or isinstance(idle_s, bool) or not idle_s > 0:
            raise SettingsError("idle_s", idle_s, "a number of seconds above 0")
        self.idle_s = float(idle_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[int, tuple[weakref.ref, float]] = {}  # id -> (generation, last touched)
        self._exempt: weakref.WeakSet = weakref.WeakSet()  # owned elsewhere: never closed here
        self._stopped = threading.Event()
        if check_every_s is not None:
            threading.Thread(target=self._sweep_every, args=(check_every_s,), name="idle-releaser",
                             daemon=True).start()

    def touch(self, generation: Closable) -> None:
        """Note that a visitor is using `generation` now (registering it the first time)."""
        with self._lock:
            if generation not in self._exempt:
                self._last[id(generation)] = (weakref.ref(generation), self._clock())

    def exempt(self, generation: Closable) -> None:
        """Never close `generation`: something else bounds its life (a class room's generation,
        closed with its room, which a whole class steps on after any pause). A touch no longer
        registers it."""
        with self._lock:
            self._exempt.add(generation)
            self._last.pop(id(generation), None)

    def sweep(self) -> int:
        """Close every generation idle for `idle_s` or longer; returns how many were closed."""
        now, closed = self._clock(), 0
        with self._lock:
            for key, (ref, last) in list(self._last.items()):
                generation = ref()
                if generation is None:
                    del self._last[key]
                elif now - last >= self.idle_s and not generation.closed:
                    generation.close()
                    closed += 1
        return closed

    def tracked(self) -> int:
        """Generations registered and still alive."""
        with self._lock:
            return sum(1 for ref, _ in self._last.values() if ref() is not None)

    def stop(self) -> None:
        self._stopped.set()

    def _sweep_every(self, seconds: float) -> None:
        while not self._stopped.wait(seconds):
            self.sweep()
