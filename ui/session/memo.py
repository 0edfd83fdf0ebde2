"""One way to remember results for a visitor: a bounded store in their session state.

A store is a dict under one session key (ui/session/keys.py names them). It holds at most `bound`
entries; when a new one would pass the bound, the least recently used goes. So a long
session never grows without bound, and what a visitor keeps coming back to stays. Results
that should not compete with each other (a chart rebuilt in 15 ms, 1,000 draws that took a
second) go in different stores.

Keys must not be fooled by a reused `id()`: a key that stands for one particular object (a
Generation, a step record) holds it in `Same`, which matches only that very object.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")
BOUND = 64  # entries per store


class Same:
    """A key part that equals only the very same object (for objects compared by value, or
    not hashable). It holds the object, so its id cannot be reused while the key is kept."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def remember(state: MutableMapping[str, Any], store: str, key: Hashable, compute: Callable[[], T],
             bound: int = BOUND) -> T:
    """The result for `key` in `store`, computed (and kept) only the first time it is asked for."""
    entries = state.setdefault(store, {})
    if key in entries:
        return _used(entries, key)
    value = entries[key] = compute()
    while len(entries) > bound:
        del entries[next(iter(entries))]  # least recently used first
    return value


def recall(state: MutableMapping[str, Any], store: str, key: Hashable) -> Any | None:
    """The result kept for `key` in `store`, or None; computes nothing."""
    entries = state.get(store, {})
    return _used(entries, key) if key in entries else None


def forget(state: MutableMapping[str, Any], store: str, key: Hashable) -> None:
    """Drop the result kept for `key` in `store` (the next `remember` computes it again)."""
    state.get(store, {}).pop(key, None)


def _used(entries: dict[Hashable, Any], key: Hashable) -> Any:
    """Mark an entry used now: the dict's order is the order of last use."""
    entries[key] = entries.pop(key)
    return entries[key]
