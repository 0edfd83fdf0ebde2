"""Slow down one browser that keeps trying wrong room codes or secrets.

The first FREE_TRIES wrong tries cost nothing (a typo); after that each one makes the next try
wait twice as long as the last, from BASE_S up to MAX_S. A right code clears the count, and a
browser that stops trying is forgotten after FORGET_S. At most MAX_KEYS browsers are
remembered (the oldest go first), so no one can fill the server's memory with it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

FREE_TRIES = 3
BASE_S = 2.0
MAX_S = 60.0
FORGET_S = 600.0
MAX_KEYS = 10_000


@dataclass
class _Record:
    failures: int
    last: float  # when the last wrong try was made
    wait_until: float


class WrongCodeThrottle:
    """Per browser key: how long before its next try may be checked."""

    def __init__(self) -> None:
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def wait_left(self, key: str, now: float) -> float:
        """Seconds `key` must still wait before a try is checked (0: it may try now)."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return 0.0
            if now - record.last > FORGET_S:
                del self._records[key]
                return 0.0
            return max(0.0, record.wait_until - now)

    def failed(self, key: str, now: float) -> None:
        """A wrong code or secret from `key`."""
        with self._lock:
            record = self._records.pop(key, None) or _Record(0, now, now)
            if now - record.last > FORGET_S:
                record = _Record(0, now, now)
            record.failures += 1
            record.last = now
            extra = record.failures - FREE_TRIES
            record.wait_until = now + (min(MAX_S, BASE_S * 2 ** (extra - 1)) if extra > 0 else 0.0)
            self._records[key] = record
            while len(self._records) > MAX_KEYS:
                self._records.popitem(last=False)

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._records.pop(key, None)
