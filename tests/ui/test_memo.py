"""ui/session/memo.py: one bounded store per purpose in the visitor's state."""

from __future__ import annotations

from typing import Any

from ui.session.memo import BOUND, Same, recall, remember


def test_a_result_is_computed_once_and_then_remembered() -> None:
    state: dict[str, Any] = {}
    calls: list[int] = []
    first = remember(state, "store", ("k", 1), lambda: calls.append(1) or ["value"])
    again = remember(state, "store", ("k", 1), lambda: calls.append(1) or ["other"])
    assert first is again and calls == [1]
    assert recall(state, "store", ("k", 1)) is first and recall(state, "store", ("k", 2)) is None


def test_a_store_keeps_at_most_its_bound_and_drops_the_least_recently_used() -> None:
    state: dict[str, Any] = {}
    for i in range(BOUND):
        remember(state, "store", i, lambda i=i: i)
    remember(state, "store", 0, lambda: -1)  # used again: now the most recent
    recall(state, "store", 1)  # read: recent too
    remember(state, "store", "new", lambda: "new")
    remember(state, "store", "newer", lambda: "newer")
    assert len(state["store"]) == BOUND
    assert recall(state, "store", 2) is None and recall(state, "store", 3) is None  # the two oldest went
    assert recall(state, "store", 0) == 0 and recall(state, "store", 1) == 1


def test_stores_do_not_evict_each_other() -> None:
    state: dict[str, Any] = {}
    remember(state, "costly", "draws", lambda: "1,000 draws")
    for i in range(3 * BOUND):
        remember(state, "cheap", i, lambda i=i: i)
    assert recall(state, "costly", "draws") == "1,000 draws"
    assert len(state["cheap"]) == BOUND


def test_same_matches_only_the_very_same_object() -> None:
    a, b = [1, 2], [1, 2]  # equal, unhashable
    assert Same(a) == Same(a) and hash(Same(a)) == hash(Same(a))
    assert Same(a) != Same(b)
    state: dict[str, Any] = {}
    remember(state, "store", ("step", Same(a)), lambda: "for a")
    assert recall(state, "store", ("step", Same(b))) is None
    assert recall(state, "store", ("step", Same(a))) == "for a"
