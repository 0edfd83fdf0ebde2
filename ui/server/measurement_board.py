"""One server's speed measurements, taken once and shared by every visitor.

The KV cache & speed page times real passes of the model. Taken per visitor, "everyone open the
KV page" started thirty benchmarks on two cores: each waited half a minute, and each got
numbers inflated by the other twenty-nine (a cached step that seemed to get faster as the
context grew). Here a measurement is keyed by what it measures (model, device, sizes, which
measurement); the first visitor to need one takes it while every other visitor who needs it
waits for that result; one measurement runs at a time on the server; and the result is kept
with when it was taken and how busy the server was meanwhile, for the page to say. "Measure
again" re-measures for everyone, at most once per REFRESH_AFTER_S, however many visitors press it.
The Same prompt page's experiments are measurements too (keyed by the visitor's prompt and
settings): they take their turn here, and the board keeps only the latest MAX_KEPT results, so
visitors' prompts cannot grow it without bound.

No Streamlit here: the page holds one board per server (st.cache_resource) and tests use their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
REFRESH_AFTER_S = 60.0  # "Measure again" re-measures results at least this old
MAX_KEPT = 64  # results kept; the oldest goes first (the KV page needs about ten per model and tier)


@dataclass(frozen=True)
class Measured(Generic[T]):
    """A measurement's result and the circumstances it was taken in."""

    value: T
    taken_at: float  # the clock's time when it finished (time.time(): seconds since the epoch)
    seconds: float  # how long it took
    other_tokens: int  # tokens the server made for visitors while it ran (0: it had the machine alone)


class MeasurementBoard:
    """Measurements by key, each taken once for the whole server.

    Args:
        clock: the time source (time.time; tests give their own).
        refresh_after_s: the youngest result "Measure again" throws away.
        max_kept: results kept at most; beyond it the oldest is dropped (measured again if asked).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time, refresh_after_s: float = REFRESH_AFTER_S,
                 max_kept: int = MAX_KEPT) -> None:
        self._clock = clock
        self._refresh_after_s = refresh_after_s
        self._max_kept = max_kept
        self._results: dict[Hashable, Measured] = {}
        self._lock = threading.Lock()  # guards _results
        self._measuring = threading.Lock()  # one measurement at a time on the server: the others queue
        self._running: Hashable | None = None

    def get(self, key: Hashable, measure: Callable[[], T], served: Callable[[], int] = lambda: 0) -> Measured[T]:
        """The result for `key`: kept, or measured now by `measure()` (waiting first for any other
        measurement on the server to finish). `served()` counts the tokens the server has made
        (its scheduler's), read before and after to tell how busy the machine was. A measurement
        that fails is not kept."""
        if (kept := self.kept(key)) is not None:
            return kept
        with self._measuring:
            if (kept := self.kept(key)) is not None:  # taken while this visitor waited
                return kept
            self._running = key
            try:
                before, started = served(), time.perf_counter()
                value = measure()
                result = Measured(value, self._clock(), time.perf_counter() - started, served() - before)
            finally:
                self._running = None
            with self._lock:
                self._results[key] = result
                while len(self._results) > self._max_kept:  # dicts keep insertion order: the oldest first
                    del self._results[next(iter(self._results))]
            return result

    def kept(self, key: Hashable) -> Measured | None:
        with self._lock:
            return self._results.get(key)

    @property
    def busy(self) -> bool:
        """Whether a measurement is running now (a visitor who needs another one will wait)."""
        return self._running is not None

    def refresh(self, keys: Callable[[Hashable], bool]) -> int:
        """Throw away the results `keys` selects that are at least REFRESH_AFTER_S old, so the
        next visitor to need them measures again; returns how many went."""
        now = self._clock()
        with self._lock:
            old = [key for key, result in self._results.items()
                   if keys(key) and now - result.taken_at >= self._refresh_after_s]
            for key in old:
                del self._results[key]
        return len(old)
